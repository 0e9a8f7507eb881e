#include "train/pipeline_checkpoint.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "autograd/node.h"
#include "nn/checkpoint.h"
#include "nn/safetensors.h"

namespace minidl::train {

namespace {

constexpr const char* kWte = "transformer.wte.weight";

// The tensors chunk v of this rank sends: its parameters', but wte only from global chunk 0 (the last chunk's head
// copy is the same tensor).
std::vector<size_t> sent_by_chunk(const PipelineModel& pipe, int v, size_t first, size_t count,
                                  const nn::NamedTensors& local) {
  std::vector<size_t> out;
  for (size_t i = first; i < first + count; ++i)
    if (local[i].first != kWte || pipe.global_chunk(v) == 0) out.push_back(i);
  return out;
}

// Names and shapes of `tensors` as a byte tensor: what the receiver allocates before the tensors themselves arrive.
Tensor header_of(const nn::NamedTensors& local, const std::vector<size_t>& which) {
  nlohmann::json j = nlohmann::json::array();
  for (size_t i : which) j.push_back({{"name", local[i].first}, {"shape", local[i].second.shape().vec()}});
  const std::string text = j.dump();
  Tensor t = Tensor::empty({int64_t(text.size())}, DType::u8);
  std::copy(text.begin(), text.end(), static_cast<char*>(t.raw_data()));
  return t;
}

}  // namespace

nn::NamedTensors gather_pipeline(const PipelineModel& pipe, const nn::NamedTensors& local, bool keep) {
  autograd::NoGradGuard no_grad;
  nn::NamedTensors whole;
  if (pipe.topology().coord().dp != 0) return whole;  // the other replicas hold the same values
  dist::ProcessGroup& pp = pipe.pp_group();
  const Device dev = pp.device();
  const int stages = pipe.spec().stages, chunks = pipe.spec().chunks();
  // Where each local chunk's tensors start in `local` (pipe.named_parameters() lists the chunks in order).
  std::vector<size_t> first(pipe.chunks().size() + 1, 0);
  for (size_t v = 0; v < pipe.chunks().size(); ++v)
    first[v + 1] = first[v] + pipe.chunks()[v]->named_parameters().size();
  MINIDL_ASSERT(first.back() == local.size(), "gather_pipeline: ", local.size(), " tensors for ", first.back(),
                " parameters");
  if (pipe.rank() != 0) {  // send every chunk, in global order, to pp rank 0
    for (size_t v = 0; v < pipe.chunks().size(); ++v) {
      const std::vector<size_t> which = sent_by_chunk(pipe, int(v), first[v], first[v + 1] - first[v], local);
      Tensor header = header_of(local, which).to(dev);
      Tensor length = Tensor::full({1}, double(header.numel()), DType::i64).to(dev);
      pp.send(length, 0, 0)->wait();
      pp.send(header, 0, 0)->wait();
      for (size_t i : which) pp.send(local[i].second.contiguous(), 0, 0)->wait();
    }
    return whole;
  }
  for (int c = 0; c < chunks; ++c) {
    const int owner = c % stages;
    if (owner == 0) {
      const int v = c / stages;
      for (size_t i : sent_by_chunk(pipe, v, first[size_t(v)], first[size_t(v) + 1] - first[size_t(v)], local))
        whole.emplace_back(local[i].first, local[i].second.to(Device::cpu()).clone());
      continue;
    }
    Tensor length = Tensor::empty({1}, DType::i64, dev);
    pp.recv(length, owner, 0)->wait();
    Tensor header = Tensor::empty({int64_t(length.item())}, DType::u8, dev);
    pp.recv(header, owner, 0)->wait();
    header = header.to(Device::cpu());
    const char* bytes = static_cast<const char*>(header.raw_data());
    for (const auto& e : nlohmann::json::parse(bytes, bytes + header.numel())) {
      Tensor t = Tensor::empty(Shape(e.at("shape").get<std::vector<int64_t>>()), local.front().second.dtype(), dev);
      pp.recv(t, owner, 0)->wait();
      whole.emplace_back(e.at("name").get<std::string>(), t.to(Device::cpu()));
    }
  }
  if (!keep) whole.clear();
  return whole;
}

std::shared_ptr<nn::GPT> consolidated_pipeline_model(const PipelineModel& pipe, bool keep) {
  nn::NamedTensors whole = gather_pipeline(pipe, pipe.named_parameters(), keep);
  if (!keep) return nullptr;
  auto one = std::make_shared<nn::GPT>(pipe.config());
  one->load_state_dict(nn::StateDict(whole.begin(), whole.end()), /*strict=*/true);
  return one;
}

namespace {

// This stage's parameters that are logical tensors of its own: all but the last stage's copy of wte.
nn::NamedTensors owned_parameters(const PipelineModel& pipe) {
  nn::NamedTensors out;
  for (auto& [name, p] : pipe.named_parameters())
    if (name != kWte || pipe.first_stage()) out.emplace_back(name, p);
  return out;
}

}  // namespace

std::vector<std::pair<std::string, int64_t>> pipeline_logical_sizes(const PipelineModel& pipe) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& [name, p] : owned_parameters(pipe)) out.emplace_back(name, p.numel());
  return out;
}

OptimizerCheckpoint pipeline_optimizer_state(const optim::AdamW& optimizer, const PipelineModel& pipe,
                                            const KeepTensors& keep) {
  const optim::AdamWState opt = optimizer.state();
  OptimizerCheckpoint out{opt.step, {}, {}};
  for (const auto& [name, p] : owned_parameters(pipe)) {
    if (!keep(name)) continue;
    out.exp_avg.emplace_back(name, optimizer.state_of(opt.m, p));
    out.exp_avg_sq.emplace_back(name, optimizer.state_of(opt.v, p));
  }
  return out;
}

void load_pipeline_model(PipelineModel& pipe, const nn::StateDict& whole) {
  for (auto& chunk : pipe.chunks()) {
    nn::StateDict mine;
    for (const auto& [name, p] : chunk->named_parameters()) {
      auto it = whole.find(name);
      MINIDL_CHECK(it != whole.end(), "pipeline stage ", pipe.rank(), ": the checkpoint has no tensor ", name);
      mine[name] = it->second;
    }
    chunk->load_state_dict(mine, /*strict=*/true);
  }
}

void restore_pipeline_model(const Checkpoint& c, PipelineModel& pipe) {
  nn::GPTConfig want = pipe.config(), have = c.model_config;
  want.dropout = have.dropout = 0;  // dropout is a training choice, not the model's shape
  MINIDL_CHECK(want == have, "checkpoint ", c.dir, ": its model (", nn::gpt_config_to_json(c.model_config),
               ") is not the one configured (", nn::gpt_config_to_json(pipe.config()), ")");
  load_pipeline_model(pipe, nn::load_safetensors((std::filesystem::path(c.dir) / "model.safetensors").string()).tensors);
}

void restore_pipeline_optimizer(const Checkpoint& c, const PipelineModel& pipe, optim::AdamW& optimizer) {
  optim::AdamWState st = optimizer.state();
  Tensor m = Tensor::zeros({optimizer.numel()}), v = Tensor::zeros({optimizer.numel()});
  for (const auto& [name, p] : pipe.named_parameters()) {
    auto im = c.exp_avg.find(name), iv = c.exp_avg_sq.find(name);
    MINIDL_CHECK(im != c.exp_avg.end() && iv != c.exp_avg_sq.end(), "checkpoint ", c.dir,
                 "/optimizer.safetensors: no optimizer state for ", name);
    MINIDL_CHECK(im->second.shape() == p.shape() && iv->second.shape() == p.shape(), "checkpoint ", c.dir,
                 "/optimizer.safetensors: optimizer state for ", name, " has shape ", im->second.shape(),
                 ", expected ", p.shape());
    optimizer.state_of(m, p).copy_(im->second);
    optimizer.state_of(v, p).copy_(iv->second);
  }
  optimizer.load_state({c.optimizer_step, m.to(st.m.device()), v.to(st.m.device())});
}

}  // namespace minidl::train
