// The CUDA handles by their own types, declared without the CUDA headers, so that code built
// for the CPU can hold them (Context, the optimizer, the weight average) and every build
// compiles. These are the structs the CUDA headers' typedefs point to: cudaStream_t is
// CUstream_st*, cudaEvent_t is CUevent_st*, cublasHandle_t is cublasContext*, cudnnHandle_t is
// cudnnContext*; so a StreamHandle passes where a cudaStream_t is wanted, without a cast.
#pragma once

struct CUstream_st;
struct CUevent_st;
struct cublasContext;
struct cudnnContext;

namespace ringtrain {

using StreamHandle = CUstream_st*;
using EventHandle = CUevent_st*;
using BlasHandle = cublasContext*;
using DnnHandle = cudnnContext*;

}  // namespace ringtrain
