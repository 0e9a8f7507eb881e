#include "train/pipeline_checkpoint.h"

#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "autograd/node.h"
#include "dist/tp_gpt.h"
#include "dist/zero.h"
#include "nn/checkpoint.h"
#include "nn/safetensors.h"
#include "train/tp_sync.h"
#include "train/zero_sync.h"

namespace minidl::train {

namespace {

constexpr const char* kWte = "transformer.wte.weight";

// A chunk's tensor-parallel split, or null at tp 1.
const dist::TensorParallelGPT* split_of(const nn::GPT& chunk) {
  return dynamic_cast<const dist::TensorParallelGPT*>(&chunk);
}

// Whether `name` is a logical tensor of this stage's own: all but the last stage's copy of wte.
bool owned(const PipelineModel& pipe, const std::string& name) { return name != kWte || pipe.first_stage(); }

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

// Collective over the tp group: `local` (one tensor per pipe.named_parameters(), this rank's slices) as whole
// tensors on the CPU, chunk by chunk, those `keep` names (every rank takes part in every all-gather).
nn::NamedTensors gather_over_tp(const PipelineModel& pipe, const nn::NamedTensors& local,
                                const std::function<bool(const std::string&)>& keep) {
  nn::NamedTensors whole;
  size_t at = 0;
  for (const auto& chunk : pipe.chunks()) {
    const dist::TensorParallelGPT* split = split_of(*chunk);
    MINIDL_ASSERT(split, "gather_over_tp: a chunk that is not tensor-parallel");
    const size_t n = chunk->named_parameters().size();
    MINIDL_ASSERT(at + n <= local.size(), "gather_over_tp: ", local.size(), " tensors for more parameters");
    for (auto& t : split->gather_whole(nn::NamedTensors(local.begin() + at, local.begin() + at + n), keep))
      whole.push_back(std::move(t));
    at += n;
  }
  MINIDL_ASSERT(at == local.size(), "gather_over_tp: ", local.size(), " tensors for ", at, " parameters");
  return whole;
}

// The PipelineSync inside the run's GradSync (itself, or decorated by TensorParallelSync).
PipelineSync& pipeline_sync_of(GradSync& sync) {
  if (auto* tp = dynamic_cast<TensorParallelSync*>(&sync)) return pipeline_sync_of(tp->inner());
  auto* pipeline = dynamic_cast<PipelineSync*>(&sync);
  MINIDL_ASSERT(pipeline, "pipeline checkpoint: the run's GradSync (", sync.name(), ") is not a pipeline's");
  return *pipeline;
}

// An optimizer state buffer (`flat`, e.g. AdamW's m) as one tensor per pipe.named_parameters() shaped like this
// rank's parameter, those `keep` names. Under ZeRO all-gathered over the stage's dp group (collective there).
nn::NamedTensors stage_state(const optim::AdamW& optimizer, const Tensor& flat, const PipelineModel& pipe,
                             PipelineSync& sync, const KeepTensors& keep) {
  const auto params = pipe.named_parameters();
  if (dist::ZeroDataParallel* zero = sync.zero()) {
    std::vector<std::string> names;
    for (const auto& [name, p] : params) names.push_back(name);
    return gather_sharded_state(zero->reducer(), zero->shard_pieces(), zero->shard_params(), optimizer, flat, names,
                                keep);
  }
  nn::NamedTensors out;
  for (const auto& [name, p] : params)
    if (keep(name)) out.emplace_back(name, optimizer.state_of(flat, p));
  return out;
}

}  // namespace

nn::NamedTensors gather_pipeline(const PipelineModel& pipe, const nn::NamedTensors& local_slices, bool keep) {
  autograd::NoGradGuard no_grad;
  nn::NamedTensors whole;
  if (pipe.topology().coord().dp != 0) return whole;  // the other replicas hold the same values
  // At tp > 1 every stage's tp group first makes its slices whole; its tp rank 0 takes part in the pipeline's gather.
  const bool split = pipe.topology().grid().tp > 1;
  const nn::NamedTensors local = split ? gather_over_tp(pipe, local_slices, {}) : local_slices;
  if (split && pipe.topology().coord().tp != 0) return whole;
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
      for (size_t i : which) pp.send(local[i].second.to(dev).contiguous(), 0, 0)->wait();
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

std::vector<std::pair<std::string, int64_t>> pipeline_logical_sizes(const PipelineModel& pipe) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& chunk : pipe.chunks()) {
    const dist::TensorParallelGPT* split = split_of(*chunk);
    for (const auto& [name, p] : chunk->named_parameters()) {
      if (!owned(pipe, name)) continue;
      int64_t n = 1;
      for (int64_t d : split ? split->layout(name).full_shape : p.shape()) n *= d;
      out.emplace_back(name, n);
    }
  }
  return out;
}

KeepTensors pipeline_checkpoint_share(const PipelineModel& pipe) {
  const dist::Grid& g = pipe.topology().grid();
  const dist::GridCoord& me = pipe.topology().coord();
  return checkpoint_share(pipeline_logical_sizes(pipe), me.dp * g.tp + me.tp, g.dp * g.tp);
}

OptimizerCheckpoint pipeline_optimizer_state(const optim::AdamW& optimizer, const PipelineModel& pipe, GradSync& sync,
                                             const KeepTensors& keep) {
  autograd::NoGradGuard no_grad;
  PipelineSync& pipeline = pipeline_sync_of(sync);
  const optim::AdamWState opt = optimizer.state();
  auto mine = [&pipe, &keep](const std::string& name) { return owned(pipe, name) && keep(name); };
  if (pipe.topology().grid().tp == 1)
    return {opt.step, stage_state(optimizer, opt.m, pipe, pipeline, KeepTensors(mine)),
            stage_state(optimizer, opt.v, pipe, pipeline, KeepTensors(mine))};
  // Every rank of a tp group needs all its slices for the all-gathers, whatever it keeps.
  return {opt.step, gather_over_tp(pipe, stage_state(optimizer, opt.m, pipe, pipeline, true), mine),
          gather_over_tp(pipe, stage_state(optimizer, opt.v, pipe, pipeline, true), mine)};
}

void load_pipeline_model(PipelineModel& pipe, const nn::StateDict& whole) {
  for (auto& chunk : pipe.chunks()) {
    if (auto* split = dynamic_cast<dist::TensorParallelGPT*>(chunk.get())) {
      split->load_whole_state_dict(whole);  // this rank's slices; throws naming a missing tensor
      continue;
    }
    nn::StateDict mine;
    for (const auto& [name, p] : chunk->named_parameters()) {
      auto it = whole.find(name);
      MINIDL_CHECK(it != whole.end(), "pipeline stage ", pipe.rank(), ": the checkpoint has no tensor ", name);
      mine[name] = it->second;
    }
    chunk->load_state_dict(mine, /*strict=*/true);
  }
}

void load_pipeline_model(PipelineModel& pipe, const std::string& path) {
  nn::SafetensorsFile file = nn::load_safetensors(path);
  try {
    load_pipeline_model(pipe, file.tensors);
  } catch (const Error& e) {
    MINIDL_CHECK(false, "load ('", path, "') at --pp ", pipe.spec().stages, ": ", e.what());
  }
}

void restore_pipeline_model(const Checkpoint& c, PipelineModel& pipe) {
  nn::GPTConfig want = pipe.config(), have = c.model_config;
  want.dropout = have.dropout = 0;  // dropout is a training choice, not the model's shape
  MINIDL_CHECK(want == have, "checkpoint ", c.dir, ": its model (", nn::gpt_config_to_json(c.model_config),
               ") is not the one configured (", nn::gpt_config_to_json(pipe.config()), ")");
  load_pipeline_model(pipe, (std::filesystem::path(c.dir) / "model.safetensors").string());
}

void restore_pipeline_optimizer(const Checkpoint& c, const PipelineModel& pipe, GradSync& sync,
                                optim::AdamW& optimizer) {
  autograd::NoGradGuard no_grad;
  PipelineSync& pipeline = pipeline_sync_of(sync);
  // This rank's part of each logical tensor: a tp slice at tp > 1 (padding zero), by name.
  std::map<std::string, Tensor> m_of, v_of;
  for (const auto& chunk : pipe.chunks()) {
    const dist::TensorParallelGPT* split = split_of(*chunk);
    for (const auto& [name, p] : chunk->named_parameters()) {
      auto im = c.exp_avg.find(name), iv = c.exp_avg_sq.find(name);
      MINIDL_CHECK(im != c.exp_avg.end() && iv != c.exp_avg_sq.end(), "checkpoint ", c.dir,
                   ": no optimizer state for ", name, " in its optimizer files");
      const Shape want = split ? split->layout(name).full_shape : p.shape();
      MINIDL_CHECK(im->second.shape() == want && iv->second.shape() == want, "checkpoint ", c.dir,
                   ": optimizer state for ", name, " has shape ", im->second.shape(), ", expected ", want);
      m_of[name] = split ? split->layout(name).slice(im->second).contiguous() : im->second;
      v_of[name] = split ? split->layout(name).slice(iv->second).contiguous() : iv->second;
    }
  }
  Tensor m = Tensor::zeros({optimizer.numel()}), v = Tensor::zeros({optimizer.numel()});
  if (dist::ZeroDataParallel* zero = pipeline.zero()) {  // this rank's shard of each (padding stays zero)
    load_sharded_state(zero->reducer(), zero->shard_pieces(), zero->shard_params(), optimizer, m, m_of);
    load_sharded_state(zero->reducer(), zero->shard_pieces(), zero->shard_params(), optimizer, v, v_of);
  } else {
    for (const auto& [name, p] : pipe.named_parameters()) {
      optimizer.state_of(m, p).copy_(m_of.at(name));
      optimizer.state_of(v, p).copy_(v_of.at(name));
    }
  }
  const Device device = optimizer.state().m.device();
  optimizer.load_state({c.optimizer_step, m.to(device), v.to(device)});
}

}  // namespace minidl::train
