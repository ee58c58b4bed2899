#pragma once
// Data-parallel training on c10d, PyTorch's collective library (it ships in the torch wheel):
// a process group made from what `torchrun` puts in the environment, gradient averaging that any
// LibTorch training loop can call, and checks that replicated ranks stay identical.
//
//   auto group = fogo::dist::init_from_env(                    // RANK, WORLD_SIZE, MASTER_ADDR...
//       fogo::dist::ProcessGroupOptions().device(device));     // the job's device: its backends
//   fogo::dist::broadcast_parameters(group, *model);           // every rank starts from rank 0's
//   fogo::dist::GradientAverager averager(group, model->parameters());
//   for (...) {
//     {
//       auto guard = averager.no_sync();                       // accumulation: no communication
//       loss(micro_batch_0).backward();
//     }
//     loss(micro_batch_1).backward();                          // buckets all-reduce as they fill
//     averager.finish();                                       // grad = sum over ranks / world
//     optimizer.step();                                        // replicated: the same on
//     optimizer.zero_grad();                                   // every rank
//     if (step % 100 == 0) {
//       fogo::dist::check_lockstep(group, fogo::dist::module_state(*model));
//     }
//   }
//
// Every wait is bounded by ProcessGroupOptions::timeout: a rank that dies or stalls makes the
// others fail with a c10::Error instead of hanging. docs/distributed.md has the details.
//
// The parts, one header each: dist/process_group.h (launch environment, backends, the group),
// dist/gradients.h (GradientAverager), dist/lockstep.h (broadcasts, lockstep checks),
// dist/sharding.h (ShardedOptimizer, shard_step).

#include "fogo/distributed/gradients.h"
#include "fogo/distributed/lockstep.h"
#include "fogo/distributed/process_group.h"
#include "fogo/distributed/sharding.h"
