// Eigen views of raw row-major arrays: how the layer math talks to Eigen without copies.
#pragma once

#include <cstdint>

#include <Eigen/Core>

namespace ringtrain::detail {

template <typename T>
using RowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using MatrixMap = Eigen::Map<RowMatrix<T>, Eigen::Unaligned>;
template <typename T>
using ConstMatrixMap = Eigen::Map<const RowMatrix<T>, Eigen::Unaligned>;
template <typename T>
using RowVectorMap = Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>, Eigen::Unaligned>;
template <typename T>
using ConstRowVectorMap = Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>, Eigen::Unaligned>;

}  // namespace ringtrain::detail
