// A device step's batch (internal to src/cuda/): the training set on the GPU (DeviceDataset,
// train.h's opaque type) and DeviceBatch, which stages a batch in pinned host memory and queues
// its upload, or its gather from a DeviceDataset, on a stream. Host memory is touched only
// here, to fill the staging buffers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <vector>

#include "ringtrain/model.h"
#include "ringtrain/tensor.h"
#include "ringtrain/train.h"

namespace ringtrain {

// The training set on the GPU (--data-on-gpu): bytes as loaded, copied once (upload_dataset).
struct DeviceDataset {
  uint8_t* images = nullptr;  // device [count, rows, cols]
  uint8_t* labels = nullptr;  // device [count]
  int64_t count = 0, rows = 0, cols = 0;

  DeviceDataset() = default;
  DeviceDataset(const DeviceDataset&) = delete;
  DeviceDataset& operator=(const DeviceDataset&) = delete;
  ~DeviceDataset();
};

// The batch's device buffers and their pinned staging, allocated on first use and grown only
// when a batch is larger than any before.
//
// Pinned staging: an upload from pageable memory may synchronise the stream, from pinned
// memory it is a plain DMA queued on it. The previous step's upload has always finished when
// the next one refills the staging (each step ends with a stream synchronisation).
class DeviceBatch {
 public:
  DeviceBatch() = default;
  ~DeviceBatch();
  DeviceBatch(const DeviceBatch&) = delete;
  DeviceBatch& operator=(const DeviceBatch&) = delete;

  // Checks the host batch's shape, grows the buffers if needed, copies it into the pinned
  // staging and shapes images(); nothing is queued. (The labels' range is the caller's check:
  // check_labels.)
  void stage(const Batch& batch, cudaStream_t stream);
  // The same for a batch gathered on the GPU: only the sample indices are staged (the caller
  // has checked them: check_indices).
  void stage(const DeviceDataset& data, std::span<const int64_t> sample_indices,
             cudaStream_t stream);
  // Queues the staged batch's upload on `stream`. A captured graph replays these copies: they
  // read the pinned buffers when the graph runs, so stage() refills them before each launch.
  // A gathered batch uploads its indices and gathers images and labels on the GPU.
  void enqueue_upload(cudaStream_t stream);
  void upload(const Batch& batch, cudaStream_t stream) {
    stage(batch, stream);
    enqueue_upload(stream);
  }

  Tensor& images() { return images_; }  // device [batch, rows, cols, 1] once staged
  const Tensor& images() const { return images_; }
  int64_t rows() const { return images_.dim(0); }
  const int32_t* labels() const { return labels_; }  // device [rows] once uploaded
  // What a captured graph bakes in besides images() and labels() (step_graph.h).
  const float* host_images() const { return host_images_; }
  const int32_t* host_rows() const { return host_rows_; }
  const int32_t* indices() const { return indices_; }
  const DeviceDataset* dataset() const { return dataset_; }  // null: a host batch

 private:
  // Room for `rows` per-row values (labels, indices) on both sides. Growth only: it waits for
  // the stream (work queued earlier may still read the old buffers), never in steady state.
  void reserve_rows(int64_t rows, cudaStream_t stream);

  Tensor images_{Device::kCuda};
  int32_t* labels_ = nullptr;   // device [row_capacity_]
  int32_t* indices_ = nullptr;  // device [row_capacity_]: a gathered batch's sample indices
  int64_t row_capacity_ = 0;
  float* host_images_ = nullptr;  // pinned [image_capacity_]
  int32_t* host_rows_ = nullptr;  // pinned: a host batch's labels, or a gathered batch's indices
  int64_t image_capacity_ = 0;
  const DeviceDataset* dataset_ = nullptr;  // where the staged batch comes from; null: the host
};

// Every label in [0, classes), checked on the host before a host batch is uploaded, as the CPU
// loss checks them.
void check_labels(const std::vector<int32_t>& labels, int64_t classes);
// Every index inside `data`, and its images of the model's input shape.
void check_indices(const DeviceDataset& data, std::span<const int64_t> indices, const Model& model);

}  // namespace ringtrain
