#include "engine/follower.h"

#include <csignal>

#include "engine/memory_plan.h"
#include "model/model.h"

namespace vesper::engine {

Status check_parallel_config(const EngineConfig& config) {
  const ParallelConfig& p = config.parallel;
  if (p.tensor_parallel_size < 1)
    return make_error("--tensor-parallel-size " + std::to_string(p.tensor_parallel_size) +
                      ": must be at least 1");
  if (p.pipeline_parallel_size < 1)
    return make_error("--pipeline-parallel-size " + std::to_string(p.pipeline_parallel_size) +
                      ": must be at least 1");
  if (!p.pipeline_layer_split.empty() && p.pipeline_parallel_size == 1)
    return make_error("--pipeline-layer-split needs --pipeline-parallel-size above 1");
  const int64_t ranks = p.tensor_parallel_size * p.pipeline_parallel_size;
  const int64_t group = p.group != nullptr ? p.group->size() : 1;
  if (ranks != group)
    return make_error("--tensor-parallel-size " + std::to_string(p.tensor_parallel_size) +
                      " needs " + std::to_string(ranks) + " processes, and this job has " +
                      std::to_string(group));
  return {};
}

Result<std::unique_ptr<model::Model>> load_model_part(const EngineConfig& config,
                                                      backend::Backend& backend) {
  const ParallelConfig& p = config.parallel;
  return model::Model::load(config.model_path, backend, p.group,
                            static_cast<int>(p.pipeline_parallel_size), p.pipeline_layer_split);
}

backend::BackendOptions backend_options(const EngineConfig& config) {
  backend::BackendOptions o;
  o.threads = config.threads;
  o.group = config.parallel.group;
  o.tensor_group = config.parallel.tensor_group;
  return o;
}

Status run_follower(const EngineConfig& config) {
  VESPER_TRY(check_parallel_config(config));
  // Rank 0 decides when the job ends: mpirun passes a SIGTERM or Ctrl-C on to every rank, and a
  // follower that died on it would leave rank 0 unable to finish (drain) its requests. The
  // follower leaves when rank 0's model is gone.
  std::signal(SIGTERM, SIG_IGN);
  std::signal(SIGINT, SIG_IGN);
  VESPER_ASSIGN_OR_RETURN(std::unique_ptr<backend::Backend> backend,
                          backend::create_backend(backend_options(config)));
  VESPER_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> model, load_model_part(config, *backend));
  return model->follow_leader(plan_rank_memory);
}

}  // namespace vesper::engine
