// How a parallel job ends, told early to the rank that must answer clients first (rank 0's
// server): a rank that aborts the job, and mpirun's kill sequence.
//
// mpirun ends a job (a rank died or exited with an error, or mpirun itself got SIGTERM or
// SIGINT) in a fixed sequence on every rank left: SIGCONT, SIGTERM T seconds later, SIGKILL T
// seconds after that, where T is Open MPI's odls_base_sigkill_timeout (1 s by default), which
// mpirun passes to its ranks as OMPI_MCA_odls_base_sigkill_timeout. A rank that keeps the time
// of the SIGCONT knows, when the SIGTERM comes, how long it has left: a drain on SIGTERM must
// answer its clients within it, whether or not the other ranks still answer.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace vesper::dist {

// What runs on the rank that ends the job (Communicator::abort: a rank that stopped answering,
// a broken link) before the job ends, with why: rank 0's server answers its in-flight requests
// there. It runs once, on the thread that aborts, and must not call MPI. One handler a process;
// an empty function removes it, after waiting for a run in progress (so the handler's captures
// need only outlive that call).
void set_abort_handler(std::function<void(const std::string& why)> handler);
// Runs the handler, if one is set, the first time only. A later call returns once that first
// run has finished: at once from within the handler, after it from another thread (whose abort
// would otherwise end the job under it).
void run_abort_handler(const std::string& why);

// Starts keeping the time of each SIGCONT (once a process; world() calls it for every rank of a
// job of more than one process).
void watch_launcher_kill();
// T above: odls_base_sigkill_timeout as mpirun passed it (0 allowed), else Open MPI's 1 s.
double launcher_kill_interval();
// Seconds until mpirun's SIGKILL when its kill sequence has begun on this process: a SIGCONT
// came less than 2T + 1 s ago (the second of grace for a kill on its way; 0 once overdue).
// nullopt otherwise, and always before watch_launcher_kill(). A SIGCONT of another origin (a
// job stopped and continued by hand) followed within that time by a SIGTERM to this rank would
// be taken for the sequence too, and shorten that drain.
std::optional<double> launcher_kill_in();

}  // namespace vesper::dist
