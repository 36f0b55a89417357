// How this process was started, and the world group of an `mpirun` job.
//
// Nothing of MPI is touched unless a command asks for more than one process: a plain `vesper`
// run never initialises MPI, and a build without Open MPI (VESPER_HAVE_MPI unset) still builds,
// its parallel flags then failing with a clear error.
#pragma once

#include <memory>

#include "core/result.h"
#include "dist/communicator.h"

namespace vesper::dist {

// Whether a launcher (mpirun / mpiexec of Open MPI, or a PMIx one) started this process as one
// rank of a job, and that job's size and this process's rank as the launcher's environment says
// (size 1, rank 0 without one).
struct LaunchInfo {
  bool under_launcher = false;
  int size = 1;
  int rank = 0;
};
LaunchInfo launch_info();

// The job's world group: MPI is initialised on first call (with thread support for the serving
// threads beside the one that calls collectives), and finalised at exit. `wanted` processes must
// be what the launcher started; errors say how to launch. The communicator lives until exit.
Result<Communicator*> world(int wanted);
// The world group if world() made it, else null.
Communicator* started_world();

// With the world's ranks laid out stage-major (rank = stage * (size / stages) + t), the
// tensor-parallel group of this rank's stage: made once (collectively), lives until exit; the
// world itself with one stage.
Communicator* stage_group(Communicator& world, int stages);

}  // namespace vesper::dist
