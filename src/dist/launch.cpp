#include "dist/launch.h"

#include <cstdlib>
#include <string>

#include "dist/job_end.h"

#if VESPER_HAVE_MPI
#include <mpi.h>

#include "dist/mpi_communicator.h"
#endif

namespace vesper::dist {
namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v == nullptr || *v == '\0' ? fallback : std::atoi(v);
}

}  // namespace

LaunchInfo launch_info() {
  LaunchInfo info;
  // Open MPI's mpirun sets OMPI_COMM_WORLD_*; PMIx launchers (prterun, srun) set PMIX_RANK.
  for (const char* size_var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (std::getenv(size_var) != nullptr) {
      info.under_launcher = true;
      info.size = env_int(size_var, 1);
      break;
    }
  }
  for (const char* rank_var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    if (std::getenv(rank_var) != nullptr) {
      info.under_launcher = true;
      info.rank = env_int(rank_var, 0);
      break;
    }
  }
  return info;
}

#if VESPER_HAVE_MPI
namespace {

MpiCommunicator* world_communicator = nullptr;

void finalize_at_exit() {
  delete world_communicator;
  world_communicator = nullptr;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace
#endif

Result<Communicator*> world(int wanted) {
  const LaunchInfo info = launch_info();
  if (!info.under_launcher)
    return make_error(std::to_string(wanted) +
                      " processes are needed: start vesper under mpirun, as in `mpirun -n " +
                      std::to_string(wanted) + " vesper ...` (README: Parallelism)");
  if (info.size != wanted)
    return make_error("mpirun started " + std::to_string(info.size) +
                      " processes, and the parallel sizes ask for " + std::to_string(wanted) +
                      " (--tensor-parallel-size x --pipeline-parallel-size)");
#if VESPER_HAVE_MPI
  if (world_communicator == nullptr) {
    int provided = 0;
    // Serialized: one thread at a time calls MPI (the engine's runner), while serving threads
    // that never call it run beside it.
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
      return make_error("MPI_Init_thread failed");
    if (provided < MPI_THREAD_SERIALIZED)
      return make_error("this Open MPI gives no MPI_THREAD_SERIALIZED support");
    world_communicator = new MpiCommunicator();
    std::atexit(finalize_at_exit);
    // mpirun ends a job with SIGCONT, SIGTERM, SIGKILL: rank 0's drain needs the first's time.
    watch_launcher_kill();
  }
  return static_cast<Communicator*>(world_communicator);
#else
  return make_error(
      "this vesper was built without Open MPI (Debian's libopenmpi-dev), so it runs one "
      "process only; install it and rebuild");
#endif
}

Communicator* stage_group(Communicator& world, int stages) {
  if (stages <= 1) return &world;
  static std::unique_ptr<Communicator> group;
  if (!group) {
    const int per_stage = world.size() / stages;
    group = world.split(world.rank() / per_stage, world.rank() % per_stage);
  }
  return group.get();
}

Communicator* started_world() {
#if VESPER_HAVE_MPI
  return world_communicator;
#else
  return nullptr;
#endif
}

}  // namespace vesper::dist
