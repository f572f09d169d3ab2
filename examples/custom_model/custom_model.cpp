// custom_model: a model of our own from ringtrain's layers, trained data-parallel over the
// ranks of `mpirun -np N custom_model [STEPS] [DATA_DIR]`. Each rank steps on its shard of the
// global batch while the ring averages the gradients in buckets as backward produces them, so
// every rank applies the same update and the replicas stay bitwise identical.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

#include "ringtrain/allreduce.h"
#include "ringtrain/data.h"
#include "ringtrain/distributed.h"
#include "ringtrain/grad_sync.h"
#include "ringtrain/layers.h"
#include "ringtrain/log.h"
#include "ringtrain/model.h"
#include "ringtrain/mpi_comm.h"
#include "ringtrain/optim.h"
#include "ringtrain/train.h"

int main(int argc, char** argv) {
  using namespace ringtrain;
  MpiSession session(&argc, &argv);
  try {
    MpiComm comm;
    setup_logging(comm.rank(), "warn");
    const int64_t steps = argc > 1 ? std::stoll(argv[1]) : 200;
    const MnistData data = load_mnist_dir(argc > 2 ? argv[2] : default_data_dir());
    const int64_t batch_per_rank = 32;

    // Our model: 784 -> 128 -> 64 -> 10, ReLU between; parameters and gradients are two flat
    // buffers that finalize() lays out. Rank 0's initial weights go to every rank.
    Model model(Shape{data.train.rows, data.train.cols, 1});
    model.add(make_flatten());
    model.add(make_dense(data.train.rows * data.train.cols, 128));
    model.add(make_relu());
    model.add(make_dense(128, 64));
    model.add(make_relu());
    model.add(make_dense(64, 10));
    model.finalize();
    model.init_params(/*seed=*/7);
    broadcast_params(comm, model);

    // The gradient averaging seam: the ring over MPI, run by a GradSync on the pieces that
    // backward reports (small first bucket, then 1M floats per bucket, overlapped).
    Context ctx;
    auto ring = make_allreduce(comm, AllreduceConfig{}, ctx);
    auto sync =
        make_grad_sync(model.grads().data(), model.grad_ranges(), *ring, GradSyncConfig{}, ctx);
    auto sgd = make_optimizer(OptimizerConfig{.kind = "sgd", .momentum = 0.9f}, model.num_params());

    EpochSampler sampler(data.train.count, /*seed=*/1);
    const int64_t steps_per_epoch = data.train.count / (batch_per_rank * comm.size());
    Batch batch;
    StepWorkspace workspace;
    double loss = 0.0;
    for (int64_t step = 0; step < steps; ++step) {
      const auto mine = rank_batch(sampler.order(step / steps_per_epoch), step % steps_per_epoch,
                                   batch_per_rank, comm.rank(), comm.size());
      make_batch(data.train, mine, batch.images, batch.labels);
      loss = train_step(model, *sgd, batch, 0.05f, workspace, ctx, sync.get()).loss;
    }

    check_replicas(comm, model, steps);  // throws on every rank if any replica differs
    const EvalResult test = evaluate_sharded(comm, model, data.test, 500, batch, ctx);
    if (comm.rank() == 0)
      std::printf(
          "custom_model: %d ranks, %lld steps, last loss %.4f, test accuracy %.4f, "
          "replicas identical\n",
          comm.size(), static_cast<long long>(steps), loss, test.accuracy());
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "custom_model: %s\n", error.what());
    MpiSession::abort_job(1);  // so no other rank waits forever on this one
  }
}
