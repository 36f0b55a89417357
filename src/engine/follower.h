// The ranks other than 0 of a parallel job (ParallelConfig): each loads its part of the model
// (a tensor-parallel shard or a pipeline stage) and does what rank 0's model does
// (model::Model::follow_leader); it has no scheduler, runner, sampler or server. Rank 0's engine is
// the only one that decides anything.
#pragma once

#include "backend/backend_factory.h"
#include "core/result.h"
#include "engine/engine_config.h"
#include "model/model.h"

namespace vesper::engine {

// What the parallel sizes ask for against what is built; errors name the flag.
Status check_parallel_config(const EngineConfig& config);

// This rank's part of config.model_path: its tensor-parallel shard or pipeline stage.
Result<std::unique_ptr<model::Model>> load_model_part(const EngineConfig& config,
                                                      backend::Backend& backend);

// The backend every rank of `config` computes on (its threads, and the job's group).
backend::BackendOptions backend_options(const EngineConfig& config);

// A follower's life: its model part loaded, then the leader's commands until rank 0's model is
// gone. Errors (a model that does not load or split, a corrupt command) are the caller's to
// report and end the job with.
Status run_follower(const EngineConfig& config);

}  // namespace vesper::engine
