// HWIO <-> KRSC filter transposes (layout.h). One grid-stride thread per destination value, a
// gather: consecutive threads write consecutive destination floats (coalesced stores) and read
// with a stride. The filters are small (9 * Cin * Cout floats, 1152 for the cnn's 8->16 layer),
// so the strided reads cost nothing worth a shared-memory tile.
#include "launch.cuh"
#include "layout.h"

namespace ringtrain::gpu {

namespace {

using detail::blocks_for;
using detail::grid_threads;
using detail::kThreads;
using detail::thread_index;

// i walks KRSC order: i = (co * taps + tap) * cin + ci.
__global__ void hwio_to_krsc_kernel(const float* __restrict__ hwio, float* __restrict__ krsc,
                                    int64_t total, int64_t taps, int64_t cin, int64_t cout) {
  for (int64_t i = thread_index(); i < total; i += grid_threads()) {
    const int64_t ci = i % cin;
    const int64_t tap = (i / cin) % taps;
    const int64_t co = i / (cin * taps);
    krsc[i] = hwio[(tap * cin + ci) * cout + co];
  }
}

// i walks HWIO order: i = (tap * cin + ci) * cout + co.
__global__ void krsc_to_hwio_kernel(const float* __restrict__ krsc, float* __restrict__ hwio,
                                    int64_t total, int64_t taps, int64_t cin, int64_t cout) {
  for (int64_t i = thread_index(); i < total; i += grid_threads()) {
    const int64_t co = i % cout;
    const int64_t ci = (i / cout) % cin;
    const int64_t tap = i / (cout * cin);
    hwio[i] = krsc[(co * taps + tap) * cin + ci];
  }
}

// The filter's value count, after the launchers' size checks; 0 means nothing to launch.
int64_t filter_values(int64_t taps, int64_t cin, int64_t cout, const char* what) {
  detail::check_size(taps, what);
  detail::check_size(cin, what);
  detail::check_size(cout, what);
  if (taps == 0 || cin == 0 || cout == 0) return 0;
  RINGTRAIN_CHECK(cin <= INT64_MAX / taps && cout <= INT64_MAX / (taps * cin),
                  "gpu::{}: {} x {} x {} values overflow int64", what, taps, cin, cout);
  return taps * cin * cout;
}

}  // namespace

void transpose_hwio_to_krsc(const float* hwio, float* krsc, int64_t taps, int64_t cin, int64_t cout,
                            cudaStream_t stream) {
  const int64_t total = filter_values(taps, cin, cout, "transpose_hwio_to_krsc");
  if (total == 0) return;
  hwio_to_krsc_kernel<<<blocks_for(total), kThreads, 0, stream>>>(hwio, krsc, total, taps, cin,
                                                                  cout);
  RINGTRAIN_CHECK_LAUNCH();
}

void transpose_krsc_to_hwio(const float* krsc, float* hwio, int64_t taps, int64_t cin, int64_t cout,
                            cudaStream_t stream) {
  const int64_t total = filter_values(taps, cin, cout, "transpose_krsc_to_hwio");
  if (total == 0) return;
  krsc_to_hwio_kernel<<<blocks_for(total), kThreads, 0, stream>>>(krsc, hwio, total, taps, cin,
                                                                  cout);
  RINGTRAIN_CHECK_LAUNCH();
}

}  // namespace ringtrain::gpu
