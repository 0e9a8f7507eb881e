#include "train/checkpoint.h"

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "autograd/node.h"
#include "dist/tensor_parallel.h"
#include "dist/expert_parallel.h"
#include "nn/hf_format.h"
#include "nn/moe.h"
#include "nn/param_layout.h"
#include "nn/atomic_file.h"
#include "nn/checkpoint.h"
#include "nn/safetensors.h"
#include "train/manifest.h"

namespace fs = std::filesystem;

namespace minidl::train {

namespace {

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kStateFile = "state.json";
constexpr const char* kManifestFile = "manifest.json";
constexpr const char* kDoneFile = "DONE";

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MINIDL_CHECK(in, "checkpoint: cannot read ", path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

bool is_step_dir(const fs::path& p) {
  const std::string name = p.filename().string();
  return name.rfind("step-", 0) == 0 && name.find('.') == std::string::npos && fs::is_directory(p);
}

// Writes the manifest of `files` (relative to tmp) and DONE into tmp, then renames it to dir: a directory is
// complete, or not there.
void seal(const fs::path& tmp, const std::string& dir, const std::vector<std::string>& files) {
  Manifest manifest;
  for (const std::string& f : files) {
    MINIDL_CHECK(fs::exists(tmp / f), "checkpoint ", tmp.string(), ": ", f, " was not written");
    manifest[f] = {uint64_t(fs::file_size(tmp / f)), fnv1a64_of_file((tmp / f).string())};
  }
  nn::write_text_file_atomically((tmp / kManifestFile).string(), manifest_json(manifest));
  nn::write_text_file_atomically((tmp / kDoneFile).string(), "complete\n");
  fs::rename(tmp, dir);
}

// dir's DONE marker and its parsed manifest; then, every file of `files` of the size and checksum it gives.
Manifest verified_manifest(const std::string& dir) {
  MINIDL_CHECK(fs::is_directory(dir), "--resume: ", dir, " is not a checkpoint directory");
  MINIDL_CHECK(fs::exists(fs::path(dir) / kDoneFile), "checkpoint ", dir,
               ": incomplete (no DONE marker: the save did not finish)");
  const std::string manifest_path = (fs::path(dir) / kManifestFile).string();
  MINIDL_CHECK(fs::exists(manifest_path), "checkpoint ", dir, ": missing ", kManifestFile);
  return parse_manifest(manifest_path, read_text(manifest_path));
}
void verify_files(const std::string& dir, const Manifest& manifest, const std::vector<std::string>& files) {
  for (const std::string& f : files) {
    const fs::path p = fs::path(dir) / f;
    auto e = manifest.find(f);
    MINIDL_CHECK(e != manifest.end(), "checkpoint ", dir, "/", kManifestFile, ": no entry for ", f);
    MINIDL_CHECK(fs::exists(p), "checkpoint ", dir, ": missing file ", f);
    const uint64_t bytes = fs::file_size(p);
    MINIDL_CHECK(bytes == e->second.bytes, "checkpoint ", p.string(), ": ", bytes, " bytes where the manifest says ",
                 e->second.bytes, " (truncated or replaced)");
    const std::string sum = fnv1a64_of_file(p.string());
    MINIDL_CHECK(sum == e->second.fnv1a64, "checkpoint ", p.string(), ": checksum ", sum, " where the manifest says ",
                 e->second.fnv1a64, " (corrupted)");
  }
}

std::atomic<bool> g_preempted{false};
extern "C" void on_preemption_signal(int) { g_preempted.store(true); }

}  // namespace

std::string scaler_state_json(const optim::GradScalerState& s) {
  return nlohmann::json{{"scale", s.scale},
                        {"clean_steps", s.clean_steps},
                        {"overflows_left", s.overflows_left},
                        {"skipped_steps", s.skipped_steps}}
      .dump();
}

optim::GradScalerState scaler_state_from_json(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text);
  return {j.at("scale").get<double>(), j.at("clean_steps").get<int64_t>(), j.at("overflows_left").get<int64_t>(),
          j.at("skipped_steps").get<int64_t>()};
}

std::string checkpoint_name(int64_t step) {
  char s[32];
  std::snprintf(s, sizeof s, "step-%08lld", (long long)step);
  return s;
}

std::string optimizer_file_name(int index, int count) {
  if (count == 1) return kOptimizerFile;
  char s[64];
  std::snprintf(s, sizeof s, "optimizer-%05d-of-%05d.safetensors", index, count);
  return s;
}

KeepTensors checkpoint_share(const std::vector<std::pair<std::string, int64_t>>& logical, int writer, int writers) {
  int64_t total = 0;
  for (const auto& t : logical) total += t.second;
  auto mine = std::make_shared<std::set<std::string>>();
  int64_t first = 0;  // the tensor's first element in the concatenation of all of them
  for (const auto& [name, numel] : logical) {
    const int64_t owner = total > 0 ? first * writers / total : 0;
    if (owner == writer) mine->insert(name);
    first += numel;
  }
  return KeepTensors([mine](const std::string& name) { return mine->count(name) > 0; });
}

void save_checkpoint(const std::string& dir, const nn::GPT* model, const std::string& vocab_json,
                     const OptimizerCheckpoint& opt, const TrainingState& state, const CheckpointWriter& writer) {
  const fs::path tmp = dir + ".tmp";
  if (writer.leader) {
    MINIDL_CHECK(!fs::exists(dir), "checkpoint: ", dir, " exists already");
    fs::remove_all(tmp);  // left by a crash during an earlier save of the same step
    fs::create_directories(tmp);
  }
  writer.barrier();  // the directory exists for every writer

  // Every rank: its share of AdamW's moments.
  MINIDL_ASSERT(opt.exp_avg.size() == opt.exp_avg_sq.size(), "save_checkpoint: m and v of different parameters");
  nn::NamedTensors moments;
  for (size_t i = 0; i < opt.exp_avg.size(); ++i) {
    moments.emplace_back("exp_avg." + opt.exp_avg[i].first, opt.exp_avg[i].second);
    moments.emplace_back("exp_avg_sq." + opt.exp_avg_sq[i].first, opt.exp_avg_sq[i].second);
  }
  nn::save_safetensors((tmp / optimizer_file_name(writer.index, writer.count)).string(), moments,
                       {{"format", "minidl-adamw"}});
  if (writer.leader) {
    MINIDL_ASSERT(model != nullptr, "save_checkpoint: the leader needs the whole model");
    nn::save_gpt((tmp / kModelFile).string(), *model, vocab_json, {{"step", std::to_string(state.step)}});
  }
  writer.barrier();  // every file is complete: the leader seals the directory
  if (!writer.leader) return;
  nlohmann::json st = {{"step", state.step},
                       {"schedule_step", state.schedule_step},
                       {"optimizer_step", opt.step},
                       {"model_config", nlohmann::json::parse(nn::gpt_config_to_json(model->config()))},
                       {"run_config", nlohmann::json::parse(state.config)}};
  if (state.scaler) st["grad_scaler"] = nlohmann::json::parse(scaler_state_json(*state.scaler));
  nn::write_text_file_atomically((tmp / kStateFile).string(), st.dump(2));

  std::vector<std::string> files{kModelFile, kStateFile};
  if (nn::hf_expressible(model->config())) files.push_back("config.json");  // save_gpt's, where transformers has one
  for (int i = 0; i < writer.count; ++i) files.push_back(optimizer_file_name(i, writer.count));
  seal(tmp, dir, files);
}

std::string replica_dir_name(int replica) {
  char name[32];
  std::snprintf(name, sizeof name, "replica-%05d", replica);
  return name;
}

std::string outer_file_name(int index, int count) {
  char name[64];
  std::snprintf(name, sizeof name, "outer-%05d-of-%05d.safetensors", index, count);
  return name;
}

void save_replicated_checkpoint(const std::string& dir, int replica, int replicas, const nn::GPT* model,
                                const std::string& vocab_json, const OptimizerCheckpoint& optimizer,
                                const TrainingState& state, const CheckpointWriter& writer,
                                const OuterCheckpoint* outer, int outer_index, bool world_leader,
                                const std::function<void()>& world_barrier) {
  const fs::path tmp = dir + ".tmp";
  if (world_leader) {
    MINIDL_CHECK(!fs::exists(dir), "checkpoint: ", dir, " exists already");
    fs::remove_all(tmp);
    fs::create_directories(tmp);
  }
  world_barrier();
  save_checkpoint((tmp / replica_dir_name(replica)).string(), model, vocab_json, optimizer, state, writer);
  const bool has_outer = replica == 0 && outer != nullptr && !outer->global.empty();
  if (has_outer) {
    const auto n = int64_t(outer->global.size());
    nn::save_safetensors(
        (tmp / outer_file_name(outer_index, writer.count)).string(),
        {{"global", Tensor::from_vector(outer->global, {n})}, {"momentum", Tensor::from_vector(outer->momentum, {n})}},
        {{"format", "minidl-diloco"}});
  }
  world_barrier();  // every replica's directory and every outer file is complete
  if (!world_leader) return;
  std::vector<std::string> files;
  for (int r = 0; r < replicas; ++r) files.push_back(replica_dir_name(r) + "/" + kManifestFile);
  if (has_outer)
    for (int i = 0; i < writer.count; ++i) files.push_back(outer_file_name(i, writer.count));
  seal(tmp, dir, files);
}

OuterCheckpoint load_outer_state(const Checkpoint& c, int index, int count) {
  MINIDL_CHECK(c.outer_files > 0, "--resume ", c.run_dir, ": no DiLoCo state (", outer_file_name(0, count),
               ", ...): it was saved by a --sync local-sgd run, whose replicas cannot restart a DiLoCo window");
  MINIDL_CHECK(c.outer_files == count, "--resume ", c.run_dir, ": DiLoCo's state was saved by ", c.outer_files,
               " ranks per replica, this run has ", count,
               " (it is flat over a rank's parameters: resume with the same dp, tp and pp)");
  const std::string path = (fs::path(c.run_dir) / outer_file_name(index, count)).string();
  const nn::SafetensorsFile f = nn::load_safetensors(path);
  auto get = [&](const char* name) {
    auto it = f.tensors.find(name);
    MINIDL_CHECK(it != f.tensors.end(), "checkpoint ", path, ": no tensor \"", name, "\"");
    return it->second.to_float_vector();
  };
  return {get("global"), get("momentum")};
}

Checkpoint load_checkpoint(const std::string& dir, int replica) {
  const Manifest manifest = verified_manifest(dir);
  if (fs::is_directory(fs::path(dir) / replica_dir_name(0))) {  // R replicas' checkpoints and DiLoCo's state
    std::vector<std::string> files;
    int replicas = 0, outer = 0, index = 0, count = 0;
    for (const auto& [f, e] : manifest) {
      if (f == replica_dir_name(replicas) + "/" + kManifestFile) ++replicas;
      if (std::sscanf(f.c_str(), "outer-%d-of-%d.safetensors", &index, &count) == 2) outer = count;
      files.push_back(f);
    }
    verify_files(dir, manifest, files);
    MINIDL_CHECK(replica < replicas, "--resume ", dir, ": holds ", replicas, " replicas' states, not replica ", replica,
                 "'s");
    Checkpoint c = load_checkpoint((fs::path(dir) / replica_dir_name(replica)).string());
    c.run_dir = dir;
    c.replicas = replicas;
    c.outer_files = outer;
    return c;
  }
  // The optimizer files: one, or count of them, each named with its index and the count.
  std::vector<std::string> optimizer_files;
  if (manifest.count(kOptimizerFile)) {
    optimizer_files.push_back(kOptimizerFile);
  } else {
    int index = -1, count = 0;
    for (const auto& [f, e] : manifest)
      if (std::sscanf(f.c_str(), "optimizer-%d-of-%d.safetensors", &index, &count) == 2) break;
    MINIDL_CHECK(count > 0, "checkpoint ", (fs::path(dir) / kManifestFile).string(), ": no entry for ", kOptimizerFile,
                 " or its shards (", optimizer_file_name(0, 2), ", ...)");
    for (int i = 0; i < count; ++i) optimizer_files.push_back(optimizer_file_name(i, count));
  }
  std::vector<std::string> files{kModelFile, kStateFile};
  files.insert(files.end(), optimizer_files.begin(), optimizer_files.end());
  verify_files(dir, manifest, files);
  Checkpoint c;
  c.dir = dir;
  c.run_dir = dir;
  nn::GPTCheckpoint model = nn::load_gpt((fs::path(dir) / kModelFile).string());
  c.model_config = model.config;
  c.vocab_json = model.metadata.at("vocab");
  const std::string state_path = (fs::path(dir) / kStateFile).string();
  nlohmann::json st;
  try {
    st = nlohmann::json::parse(read_text(state_path));
  } catch (const nlohmann::json::exception& e) {
    MINIDL_CHECK(false, "checkpoint ", state_path, ": not valid JSON (", e.what(), ")");
  }
  try {
    c.state.step = st.at("step").get<int64_t>();
    c.state.schedule_step = st.at("schedule_step").get<int64_t>();
    c.optimizer_step = st.at("optimizer_step").get<int64_t>();
    c.state.config = st.at("run_config").dump();
    if (st.contains("grad_scaler")) c.state.scaler = scaler_state_from_json(st["grad_scaler"].dump());
  } catch (const nlohmann::json::exception& e) {
    MINIDL_CHECK(false, "checkpoint ", state_path, ": missing or mistyped field (", e.what(), ")");
  }
  for (const std::string& f : optimizer_files) {
    nn::SafetensorsFile opt = nn::load_safetensors((fs::path(dir) / f).string());
    for (auto& [name, t] : opt.tensors) {
      const bool v = name.rfind("exp_avg_sq.", 0) == 0, m = !v && name.rfind("exp_avg.", 0) == 0;
      if (!m && !v) continue;
      auto& into = v ? c.exp_avg_sq : c.exp_avg;
      MINIDL_CHECK(into.emplace(name.substr(v ? 11 : 8), t).second, "checkpoint ", dir, "/", f, ": ", name,
                   " is also in another optimizer file");
    }
  }
  return c;
}

std::vector<std::string> complete_checkpoints(const std::string& parent,
                                              const std::function<void(const std::string&)>& log) {
  std::vector<std::string> out;
  if (!fs::is_directory(parent)) return out;
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(parent))
    if (is_step_dir(e.path())) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (fs::exists(*it / kDoneFile))
      out.push_back(it->string());
    else
      log("skipping " + it->string() + ": incomplete (no DONE marker)");
  }
  return out;
}

std::optional<Checkpoint> latest_checkpoint(const std::string& parent,
                                            const std::function<void(const std::string&)>& log, int replica) {
  for (const std::string& dir : complete_checkpoints(parent, log)) {
    try {
      return load_checkpoint(dir, replica);
    } catch (const Error& e) { log("skipping " + dir + ": " + e.what()); }
  }
  return std::nullopt;
}

void prune_checkpoints(const std::string& parent, int64_t keep) {
  std::vector<fs::path> complete;
  for (const auto& e : fs::directory_iterator(parent)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) == 0 && name.size() > 4 && name.substr(name.size() - 4) == ".tmp")
      fs::remove_all(e.path());
    else if (is_step_dir(e.path()) && fs::exists(e.path() / kDoneFile))
      complete.push_back(e.path());
  }
  std::sort(complete.begin(), complete.end());
  for (size_t i = 0; i + size_t(keep) < complete.size(); ++i) fs::remove_all(complete[i]);
}

void install_preemption_handlers() {
  std::signal(SIGTERM, on_preemption_signal);
  std::signal(SIGUSR1, on_preemption_signal);
}

bool preemption_requested() { return g_preempted.load(); }

// ---- every layout through the stage: gathers to one process's tensors, and back ----

namespace {

constexpr const char* kWte = "transformer.wte.weight";

// The tensors chunk v of this rank sends: its parameters', but wte only from global chunk 0 (the last chunk's head
// copy is the same tensor).
std::vector<size_t> sent_by_chunk(const Stage& stage, int v, size_t first, size_t count,
                                  const nn::NamedTensors& local) {
  std::vector<size_t> out;
  for (size_t i = first; i < first + count; ++i)
    if (local[i].first != kWte || stage.global_chunk(v) == 0) out.push_back(i);
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

// This rank's place in the group holding the same parameters (dp × cp: dist/topology.h), and its size.
int dp_rank(const Stage& stage) { return stage.topology() ? stage.topology()->dp_group().rank() : 0; }
// The tensor-parallel group's size and this rank's place in it, as the parameters lie (every parameter of a split
// model, replicated ones too, names the group; a whole one is a group of one).
int tp_size(const Stage& stage) { return nn::layout_of(stage.parameters().front()).ranks; }
int tp_rank(const Stage& stage) { return nn::layout_of(stage.parameters().front()).rank; }

}  // namespace

nn::NamedTensors gather_stages(const Stage& stage, const nn::NamedTensors& local_slices, bool keep) {
  autograd::NoGradGuard no_grad;
  nn::NamedTensors whole;
  if (dp_rank(stage) != 0) return whole;  // the other replicas hold the same values
  // At tp > 1 every stage's tp group first makes its slices whole; its tp rank 0 takes part in the stages' gather.
  const nn::NamedTensors local =
      tp_size(stage) > 1 ? dist::gather_whole(stage.parameters(), local_slices) : local_slices;
  if (tp_rank(stage) != 0) return whole;
  const int stages = stage.spec().stages, chunks = stage.spec().chunks();
  // Where each local chunk's tensors start in `local` (stage.named_parameters() lists the chunks in order).
  std::vector<size_t> first(size_t(stage.chunk_count()) + 1, 0);
  for (int v = 0; v < stage.chunk_count(); ++v)
    first[size_t(v) + 1] = first[size_t(v)] + stage.chunk(v).named_parameters().size();
  MINIDL_ASSERT(first.back() == local.size(), "gather_stages: ", local.size(), " tensors for ", first.back(),
                " parameters");
  if (stage.rank() != 0) {  // send every chunk, in global order, to pp rank 0
    dist::ProcessGroup& pp = *stage.pp_group();
    for (int v = 0; v < stage.chunk_count(); ++v) {
      const std::vector<size_t> which =
          sent_by_chunk(stage, v, first[size_t(v)], first[size_t(v) + 1] - first[size_t(v)], local);
      Tensor header = header_of(local, which).to(pp.device());
      Tensor length = Tensor::full({1}, double(header.numel()), DType::i64).to(pp.device());
      pp.send(length, 0, 0)->wait();
      pp.send(header, 0, 0)->wait();
      for (size_t i : which) pp.send(local[i].second.to(pp.device()).contiguous(), 0, 0)->wait();
    }
    return whole;
  }
  for (int c = 0; c < chunks; ++c) {
    const int owner = c % stages;
    if (owner == 0) {
      const int v = c / stages;
      for (size_t i : sent_by_chunk(stage, v, first[size_t(v)], first[size_t(v) + 1] - first[size_t(v)], local))
        whole.emplace_back(local[i].first, local[i].second.to(Device::cpu()).clone());
      continue;
    }
    dist::ProcessGroup& pp = *stage.pp_group();
    const Device dev = pp.device();
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

nn::NamedTensors whole_expert_biases(const Stage& stage) {
  const nn::GPTConfig& cfg = stage.config();
  nn::NamedTensors out;
  if (!cfg.moe()) return out;
  // One row per block (zeros where a block is dense or on another stage), summed over the pp group: each block's
  // row comes from the one stage holding it.
  const int64_t E = cfg.moe_experts;
  std::vector<double> rows(size_t(cfg.n_layer * E), 0.0);
  for (int v = 0; v < stage.chunk_count(); ++v)
    for (const auto& [name, b] : stage.chunk(v).named_buffers()) {
      if (name.find(".moe.expert_bias") == std::string::npos) continue;
      const int64_t i = std::stoll(name.substr(std::string("transformer.h.").size()));
      const std::vector<double> values = b.to_vector();
      std::copy(values.begin(), values.end(), rows.begin() + i * E);
    }
  dist::ProcessGroup* pp = stage.pp_group();
  if (pp && pp->size() > 1) {
    Tensor t = Tensor::from_vector(rows, {int64_t(rows.size())}, DType::f64).to(pp->device());
    rows = sum_over(*pp, t).to_vector();
  }
  for (int64_t i = 0; i < cfg.n_layer; ++i)
    if (cfg.moe_layer(i))
      out.emplace_back("transformer.h." + std::to_string(i) + ".moe.expert_bias",
                       Tensor::from_vector(std::vector<double>(rows.begin() + i * E, rows.begin() + (i + 1) * E), {E}));
  return out;
}

// Expert parallelism (one pipeline stage): every routed expert's parameters under their whole-model names, each
// broadcast over the ep group from the rank holding it.
nn::NamedTensors gather_experts(const Stage& stage) {
  autograd::NoGradGuard no_grad;
  nn::NamedTensors out;
  dist::ProcessGroup& ep = stage.topology()->ep_group();
  for (nn::MoE* moe : nn::moe_layers(stage.chunk(0))) {
    const int64_t E = moe->config().moe_experts, per_rank = E / ep.size();
    const nn::NamedTensors shapes = moe->expert(moe->experts->first_index()).named_parameters();
    for (int64_t e = 0; e < E; ++e)
      for (size_t k = 0; k < shapes.size(); ++k) {
        const Tensor& like = shapes[k].second;
        Tensor t = moe->holds(e) ? moe->expert(e).named_parameters()[k].second.detach().contiguous().clone()
                                 : Tensor::empty(like.shape(), like.dtype(), like.device());
        ep.broadcast(t, int(e / per_rank))->wait();
        out.emplace_back("transformer.h." + std::to_string(moe->block()) + ".moe.experts." + std::to_string(e) + "." +
                             shapes[k].first,
                         t.to(Device::cpu()));
      }
  }
  return out;
}

std::shared_ptr<nn::GPT> consolidated_model(const Stage& stage, bool keep) {
  const bool spread = stage.expert_parallel();
  // One process's whole model: itself (not under context parallelism, whose attention is a ring of the cp group)
  if (stage.spec().chunks() == 1 && tp_size(stage) == 1 && !stage.context_parallel() && !spread)
    return keep ? std::shared_ptr<nn::GPT>(&stage.chunk(0), [](nn::GPT*) {}) : nullptr;
  nn::NamedTensors whole = gather_stages(stage, stage.named_parameters(), keep);
  // The experts other ep ranks hold (one stage: train/config.cpp refuses --ep with --pp).
  const nn::NamedTensors experts = spread ? gather_experts(stage) : nn::NamedTensors();
  const nn::NamedTensors biases = whole_expert_biases(stage);
  if (!keep) return nullptr;
  auto one = std::make_shared<nn::GPT>(stage.config());
  nn::StateDict dict(whole.begin(), whole.end());
  dict.insert(experts.begin(), experts.end());  // the held ones are there already, the same values
  dict.insert(biases.begin(), biases.end());
  one->load_state_dict(dict, /*strict=*/true);
  return one;
}

std::vector<std::pair<std::string, int64_t>> logical_sizes(const Stage& stage) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (int v = 0; v < stage.chunk_count(); ++v)
    for (const auto& [name, p] : stage.chunk(v).named_parameters()) {
      if (!stage.owns(name)) continue;
      out.emplace_back(name, nn::layout_of(p).full_numel());
    }
  return out;
}

KeepTensors checkpoint_share(const Stage& stage) {
  const int dp = stage.topology() ? stage.topology()->dp_group().size() : 1;
  const int tp = tp_size(stage);
  if (!stage.expert_parallel())
    return checkpoint_share(logical_sizes(stage), dp_rank(stage) * tp + tp_rank(stage), dp * tp);
  // Expert parallelism: the dense tensors shared out over the dp ranks as ever (their list is every rank's); each
  // routed expert's written by the rank of the first expert-dp replica holding it.
  std::vector<std::pair<std::string, int64_t>> dense;
  for (const auto& t : logical_sizes(stage))
    if (!dist::is_expert_parameter(t.first)) dense.push_back(t);
  const KeepTensors shared = checkpoint_share(dense, dp_rank(stage), dp);
  const bool first_replica = stage.topology()->expert_dp_group().rank() == 0;
  return KeepTensors([shared, first_replica](const std::string& name) {
    return dist::is_expert_parameter(name) ? first_replica : shared(name);
  });
}

OptimizerCheckpoint optimizer_state(const optim::AdamW& optimizer, const Stage& stage, GradSync& sync,
                                    const KeepTensors& keep) {
  autograd::NoGradGuard no_grad;
  const optim::AdamWState opt = optimizer.state();
  auto mine = [&stage, &keep](const std::string& name) { return stage.owns(name) && keep(name); };
  // One tensor per stage parameter shaped like this rank's (every rank of a tp group needs all its slices for the
  // all-gathers, whatever it keeps), then whole.
  const bool split = tp_size(stage) > 1;
  auto moments = [&](const Tensor& flat) {
    nn::NamedTensors local;
    for (int v = 0; v < stage.chunk_count(); ++v)
      for (auto& t : sync.state(optimizer, flat, stage, v, split ? KeepTensors(true) : KeepTensors(mine)))
        local.push_back(std::move(t));
    return split ? dist::gather_whole(stage.parameters(), local, mine) : local;
  };
  return {opt.step, moments(opt.m), moments(opt.v)};
}

void load_model(Stage& stage, const std::string& path) {
  try {
    const nn::StateDict tensors = nn::read_model_tensors(path, stage.config());  // minidl's names and layouts
    const bool split = tp_size(stage) > 1;
    for (int v = 0; v < stage.chunk_count(); ++v) {
      const nn::GPTStage& part = stage.chunk(v).stage();
      if (!split && !stage.expert_parallel() && part.embedding && part.head && part.first_block == 0 &&
          part.last_block == stage.config().n_layer) {
        stage.chunk(v).load_state_dict(tensors, /*strict=*/true);  // the whole model: nothing left over
        continue;
      }
      nn::StateDict mine;  // this rank's part of each of the chunk's tensors, as its layout says
      for (const auto& [name, p] : stage.chunk(v).named_parameters()) {
        auto it = tensors.find(name);
        MINIDL_CHECK(it != tensors.end(), "no tensor ", nn::hf_tensor_name(stage.config(), name),
                     stage.config().llama() ? " (minidl's " + name + ")" : "");
        const nn::ParamLayout layout = nn::layout_of(p);
        mine[name] = layout.is_split() ? layout.slice(it->second) : it->second;
      }
      for (const auto& [name, b] : stage.chunk(v).named_buffers())  // an MoE's expert biases
        if (tensors.count(name)) mine[name] = tensors.at(name);
      stage.chunk(v).load_state_dict(mine, /*strict=*/true);
    }
  } catch (const Error& e) { MINIDL_CHECK(false, "load ('", path, "'): ", e.what()); }
}

void restore_model(const Checkpoint& c, Stage& stage) {
  nn::GPTConfig want = stage.config(), have = c.model_config;
  want.dropout = have.dropout = 0;  // dropout is a training choice, not the model's shape
  MINIDL_CHECK(want == have, "checkpoint ", c.dir, ": its model (", nn::gpt_config_to_json(c.model_config),
               ") is not the one configured (", nn::gpt_config_to_json(stage.config()), ")");
  load_model(stage, (fs::path(c.dir) / kModelFile).string());
}

void restore_optimizer(const Checkpoint& c, const Stage& stage, GradSync& sync, optim::AdamW& optimizer) {
  autograd::NoGradGuard no_grad;
  Tensor m = Tensor::zeros({optimizer.numel()}), v = Tensor::zeros({optimizer.numel()});
  for (int k = 0; k < stage.chunk_count(); ++k) {
    // This rank's part of each logical tensor, as its parameter's layout says (a tp slice, padding zero), by name.
    std::map<std::string, Tensor> m_of, v_of;
    for (const auto& [name, p] : stage.chunk(k).named_parameters()) {
      auto im = c.exp_avg.find(name), iv = c.exp_avg_sq.find(name);
      MINIDL_CHECK(im != c.exp_avg.end() && iv != c.exp_avg_sq.end(), "checkpoint ", c.dir, ": no optimizer state for ",
                   name, " in its optimizer files");
      const nn::ParamLayout layout = nn::layout_of(p);
      const Shape want = layout.full_shape;
      MINIDL_CHECK(im->second.shape() == want && iv->second.shape() == want, "checkpoint ", c.dir,
                   ": optimizer state for ", name, " has shape ", im->second.shape(), ", expected ", want);
      m_of[name] = layout.is_split() ? layout.slice(im->second).contiguous() : im->second;
      v_of[name] = layout.is_split() ? layout.slice(iv->second).contiguous() : iv->second;
    }
    sync.load_state(optimizer, m, stage, k, m_of);  // ZeRO: this rank's shard of each (padding stays zero)
    sync.load_state(optimizer, v, stage, k, v_of);
  }
  const Device device = optimizer.state().m.device();
  optimizer.load_state({c.optimizer_step, m.to(device), v.to(device)});
}

}  // namespace minidl::train
