// A device step's batch: staging, upload and gather (device_batch.h), and the training set on
// the GPU (upload_dataset, train.h).
#include "device_batch.h"

#include <algorithm>

#include "gather.h"
#include "ringtrain/check.h"
#include "ringtrain/cuda_check.h"

namespace ringtrain {

DeviceDataset::~DeviceDataset() {
  (void)cudaFree(images);
  (void)cudaFree(labels);
}

DeviceBatch::~DeviceBatch() {
  // A destructor must not throw: errors here mean the device is already lost.
  (void)cudaFree(labels_);
  (void)cudaFree(indices_);
  (void)cudaFreeHost(host_images_);
  (void)cudaFreeHost(host_rows_);
}

void DeviceBatch::reserve_rows(int64_t rows, cudaStream_t stream) {
  if (rows <= row_capacity_) return;
  RINGTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream));
  RINGTRAIN_CHECK_CUDA(cudaFree(labels_));
  RINGTRAIN_CHECK_CUDA(cudaFree(indices_));
  RINGTRAIN_CHECK_CUDA(cudaFreeHost(host_rows_));
  labels_ = indices_ = host_rows_ = nullptr;
  row_capacity_ = 0;
  const size_t bytes = static_cast<size_t>(rows) * sizeof(int32_t);
  RINGTRAIN_CHECK_CUDA(cudaMalloc(&labels_, bytes));
  RINGTRAIN_CHECK_CUDA(cudaMalloc(&indices_, bytes));
  RINGTRAIN_CHECK_CUDA(cudaMallocHost(&host_rows_, bytes));
  row_capacity_ = rows;
}

void DeviceBatch::stage(const Batch& batch, cudaStream_t stream) {
  const int64_t rows = batch.images.dim(0);
  RINGTRAIN_CHECK(
      batch.images.device() == Device::kCpu && static_cast<int64_t>(batch.labels.size()) == rows,
      "a device step takes a host batch with one label per image ({} images, {} labels)", rows,
      batch.labels.size());
  const int64_t values = batch.images.numel();
  reserve_rows(rows, stream);
  if (values > image_capacity_) {
    RINGTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream));
    RINGTRAIN_CHECK_CUDA(cudaFreeHost(host_images_));
    host_images_ = nullptr;
    image_capacity_ = 0;
    RINGTRAIN_CHECK_CUDA(
        cudaMallocHost(&host_images_, static_cast<size_t>(values) * sizeof(float)));
    image_capacity_ = values;
  }
  std::copy_n(batch.images.data(), values, host_images_);
  std::copy_n(batch.labels.data(), rows, host_rows_);
  images_.resize(batch.images.shape());
  dataset_ = nullptr;
}

void DeviceBatch::stage(const DeviceDataset& data, std::span<const int64_t> sample_indices,
                        cudaStream_t stream) {
  const auto rows = static_cast<int64_t>(sample_indices.size());
  reserve_rows(rows, stream);
  for (int64_t r = 0; r < rows; ++r)
    host_rows_[r] = static_cast<int32_t>(sample_indices[static_cast<size_t>(r)]);
  images_.resize(Shape{rows, data.rows, data.cols, 1});  // make_batch's shape
  dataset_ = &data;
}

void DeviceBatch::enqueue_upload(cudaStream_t stream) {
  const int64_t rows = images_.dim(0);
  const size_t row_bytes = static_cast<size_t>(rows) * sizeof(int32_t);
  if (dataset_ == nullptr) {
    copy_floats_async(images_.data(), Device::kCuda, host_images_, Device::kCpu, images_.numel(),
                      stream);
    RINGTRAIN_CHECK_CUDA(
        cudaMemcpyAsync(labels_, host_rows_, row_bytes, cudaMemcpyHostToDevice, stream));
    return;
  }
  RINGTRAIN_CHECK_CUDA(
      cudaMemcpyAsync(indices_, host_rows_, row_bytes, cudaMemcpyHostToDevice, stream));
  gpu::gather_batch(dataset_->images, dataset_->labels, indices_, rows,
                    dataset_->rows * dataset_->cols, kPixelScale, images_.data(), labels_, stream);
}

void check_labels(const std::vector<int32_t>& labels, int64_t classes) {
  for (size_t r = 0; r < labels.size(); ++r) {
    RINGTRAIN_CHECK(labels[r] >= 0 && labels[r] < classes, "label {} of row {} is outside [0, {})",
                    labels[r], r, classes);
  }
}

void check_indices(const DeviceDataset& data, std::span<const int64_t> indices,
                   const Model& model) {
  RINGTRAIN_CHECK((Shape{data.rows, data.cols, 1} == model.input_shape()),
                  "the data set's {}x{} images do not fit the model's input {}", data.rows,
                  data.cols, model.input_shape().str());
  for (const int64_t i : indices) {
    RINGTRAIN_CHECK(i >= 0 && i < data.count,
                    "sample index {} is outside the data set on the GPU [0, {})", i, data.count);
  }
}

std::shared_ptr<const DeviceDataset> upload_dataset(const Dataset& data, int64_t classes) {
  RINGTRAIN_CHECK(static_cast<int64_t>(data.images.size()) == data.count * data.image_size() &&
                      static_cast<int64_t>(data.labels.size()) == data.count,
                  "upload_dataset: {} images of {}x{} need {} bytes and {} labels; got {} and {}",
                  data.count, data.rows, data.cols, data.count * data.image_size(), data.count,
                  data.images.size(), data.labels.size());
  RINGTRAIN_CHECK(data.count < (int64_t{1} << 31),
                  "a data set on the GPU holds under 2^31 samples ({} here)", data.count);
  // Checked once here, as check_labels checks every host batch.
  for (size_t i = 0; i < data.labels.size(); ++i) {
    RINGTRAIN_CHECK(data.labels[i] < classes, "label {} of sample {} is outside [0, {})",
                    data.labels[i], i, classes);
  }
  auto device = std::make_shared<DeviceDataset>();
  device->count = data.count;
  device->rows = data.rows;
  device->cols = data.cols;
  // A captured step graph must not outlive buffers allocated before it (step_graph.h).
  note_device_allocation();
  RINGTRAIN_CHECK_CUDA(cudaMalloc(&device->images, std::max<size_t>(data.images.size(), 1)));
  RINGTRAIN_CHECK_CUDA(cudaMalloc(&device->labels, std::max<size_t>(data.labels.size(), 1)));
  // Set-up, not the step: a plain synchronous copy (ordered after everything queued before by
  // the device synchronisation).
  RINGTRAIN_CHECK_CUDA(cudaDeviceSynchronize());
  RINGTRAIN_CHECK_CUDA(
      cudaMemcpy(device->images, data.images.data(), data.images.size(), cudaMemcpyHostToDevice));
  RINGTRAIN_CHECK_CUDA(
      cudaMemcpy(device->labels, data.labels.data(), data.labels.size(), cudaMemcpyHostToDevice));
  return device;
}

int64_t device_dataset_bytes(const DeviceDataset& data) {
  return data.count * (data.rows * data.cols + 1);
}

}  // namespace ringtrain
