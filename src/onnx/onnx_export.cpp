// The ONNX exporter (see onnx_export.h), on ONNX's own protobuf classes: one node per
// ringtrain layer, the weights as initializers in raw little-endian float32.
#include "ringtrain/onnx_export.h"

#include <bit>
#include <exception>

#include <fmt/format.h>
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include "ringtrain/check.h"
#include "ringtrain/checkpoint.h"

namespace ringtrain {

namespace {

// ir_version 7 is the oldest that opset 13 may declare: runtimes older than ONNX 1.12's
// IR 8 still read it.
constexpr int64_t kIrVersion = 7;

void set_float_tensor_type(onnx::ValueInfoProto& value, const std::string& name,
                           const std::vector<int64_t>& per_sample) {
  value.set_name(name);
  onnx::TypeProto_Tensor* type = value.mutable_type()->mutable_tensor_type();
  type->set_elem_type(onnx::TensorProto_DataType_FLOAT);
  onnx::TensorShapeProto* shape = type->mutable_shape();
  shape->add_dim()->set_dim_param("N");
  for (const int64_t dim : per_sample) shape->add_dim()->set_dim_value(dim);
}

void add_ints(onnx::NodeProto& node, const std::string& name, std::initializer_list<int64_t> ints) {
  onnx::AttributeProto* attribute = node.add_attribute();
  attribute->set_name(name);
  attribute->set_type(onnx::AttributeProto_AttributeType_INTS);
  for (const int64_t value : ints) attribute->add_ints(value);
}

void add_int(onnx::NodeProto& node, const std::string& name, int64_t value) {
  onnx::AttributeProto* attribute = node.add_attribute();
  attribute->set_name(name);
  attribute->set_type(onnx::AttributeProto_AttributeType_INT);
  attribute->set_i(value);
}

onnx::NodeProto& add_node(onnx::GraphProto& graph, const std::string& op, const std::string& name,
                          std::initializer_list<std::string> inputs, const std::string& output) {
  onnx::NodeProto* node = graph.add_node();
  node->set_op_type(op);
  node->set_name(name);
  for (const std::string& input : inputs) node->add_input(input);
  node->add_output(output);
  return *node;
}

// The PyTorch module's name for a layer with parameters ("fc1"), else its op and position.
std::string node_name(const TorchLayer& layer, size_t index) {
  if (!layer.name.empty()) return layer.name;
  switch (layer.op) {
    case TorchOp::kRelu:
      return fmt::format("relu_{}", index);
    case TorchOp::kMaxPool2x2:
      return fmt::format("pool_{}", index);
    case TorchOp::kFlatten:
      return fmt::format("flatten_{}", index);
    case TorchOp::kDense:
    case TorchOp::kConv3x3:
      break;
  }
  RINGTRAIN_FAIL("a dense or conv layer without a name");
}

onnx::ModelProto build_model(const TorchModel& model, const std::string& producer_version) {
  static_assert(std::endian::native == std::endian::little,
                "raw_data is copied as it lies in memory: little-endian hosts only");
  onnx::ModelProto proto;
  proto.set_ir_version(kIrVersion);
  proto.set_producer_name("ringtrain");
  proto.set_producer_version(producer_version);
  onnx::OperatorSetIdProto* opset = proto.add_opset_import();
  opset->set_domain("");
  opset->set_version(kOnnxOpset);
  onnx::GraphProto& graph = *proto.mutable_graph();
  graph.set_name("ringtrain");
  graph.set_doc_string(
      "input pixels: float32 [N, 1, H, W], each byte / 255 (the [0, 1] scale ringtrain trains "
      "on); outputs: logits [N, classes] and their softmax, probabilities");
  set_float_tensor_type(*graph.add_input(), "pixels", model.input);
  for (const TorchTensor& tensor : model.tensors) {
    onnx::TensorProto* initializer = graph.add_initializer();
    initializer->set_name(tensor.name);
    initializer->set_data_type(onnx::TensorProto_DataType_FLOAT);
    for (const int64_t dim : tensor.shape) initializer->add_dims(dim);
    initializer->set_raw_data(tensor.values.data(), tensor.values.size() * sizeof(float));
  }
  std::string current = "pixels";
  for (size_t i = 0; i < model.layers.size(); ++i) {
    const TorchLayer& layer = model.layers[i];
    const bool last = i + 1 == model.layers.size();
    const std::string name = node_name(layer, i);
    const std::string output = last ? "logits" : name + "_out";
    switch (layer.op) {
      case TorchOp::kDense: {
        onnx::NodeProto& node =
            add_node(graph, "Gemm", name, {current, name + ".weight", name + ".bias"}, output);
        add_int(node, "transB", 1);  // weight [out, in], as PyTorch's Linear holds it
        break;
      }
      case TorchOp::kConv3x3: {
        onnx::NodeProto& node =
            add_node(graph, "Conv", name, {current, name + ".weight", name + ".bias"}, output);
        add_ints(node, "kernel_shape", {3, 3});
        add_ints(node, "pads", {1, 1, 1, 1});  // 'same' zero padding
        add_ints(node, "strides", {1, 1});
        break;
      }
      case TorchOp::kRelu:
        add_node(graph, "Relu", name, {current}, output);
        break;
      case TorchOp::kMaxPool2x2: {
        onnx::NodeProto& node = add_node(graph, "MaxPool", name, {current}, output);
        add_ints(node, "kernel_shape", {2, 2});
        add_ints(node, "strides", {2, 2});
        break;
      }
      case TorchOp::kFlatten:
        add_int(add_node(graph, "Flatten", name, {current}, output), "axis", 1);
    }
    current = output;
  }
  RINGTRAIN_CHECK(current == "logits", "the model ends without a layer");
  add_int(add_node(graph, "Softmax", "softmax", {"logits"}, "probabilities"), "axis", 1);
  set_float_tensor_type(*graph.add_output(), "logits", {model.classes});
  set_float_tensor_type(*graph.add_output(), "probabilities", {model.classes});
  return proto;
}

}  // namespace

bool onnx_export_available() {
  return true;
}

std::string onnx_model_bytes(const TorchModel& model, const std::string& producer_version,
                             const std::string& flag) {
  const onnx::ModelProto proto = build_model(model, producer_version);
  try {
    onnx::checker::check_model(proto);
    // Strict inference on a copy: every node's shapes must follow, and must agree with the
    // declared outputs [N, classes].
    onnx::ModelProto inferred = proto;
    onnx::shape_inference::InferShapes(inferred, onnx::OpSchemaRegistry::Instance(),
                                       onnx::ShapeInferenceOptions(/*check_type=*/true,
                                                                   /*strict_mode=*/1));
  } catch (const std::exception& error) {
    throw Error(
        fmt::format("{}: ONNX's checker refuses the exported model: {}", flag, error.what()));
  }
  std::string bytes;
  RINGTRAIN_CHECK(proto.SerializeToString(&bytes), "{}: the ONNX model does not serialize", flag);
  return bytes;
}

void write_onnx_model(const std::string& path, const TorchModel& model,
                      const std::string& producer_version, const std::string& flag) {
  const std::string bytes = onnx_model_bytes(model, producer_version, flag);
  write_file_atomically(path, {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
}

}  // namespace ringtrain
