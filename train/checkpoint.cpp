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

#include "dist/tp_gpt.h"
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

// The shape of parameter `name` in one process: a tensor-parallel rank holds a slice of it.
Shape logical_shape(const nn::Module& model, const std::string& name, const Tensor& p) {
  if (auto* split = dynamic_cast<const dist::TensorParallelGPT*>(&model)) return split->layout(name).full_shape;
  return p.shape();
}

bool is_step_dir(const fs::path& p) {
  const std::string name = p.filename().string();
  return name.rfind("step-", 0) == 0 && name.find('.') == std::string::npos && fs::is_directory(p);
}

std::atomic<bool> g_preempted{false};
extern "C" void on_preemption_signal(int) { g_preempted.store(true); }

}  // namespace

std::string checkpoint_name(int64_t step) {
  char s[32];
  std::snprintf(s, sizeof s, "step-%08lld", (long long)step);
  return s;
}

OptimizerCheckpoint logical_optimizer_state(const optim::AdamW& optimizer, GradSync& sync, const nn::Module& model,
                                            const KeepTensors& keep) {
  const optim::AdamWState opt = optimizer.state();
  return {opt.step, sync.logical_state(optimizer, opt.m, model, keep), sync.logical_state(optimizer, opt.v, model, keep)};
}

void save_checkpoint(const std::string& dir, const nn::GPT& model, const std::string& vocab_json,
                     const optim::AdamW& optimizer, const TrainingState& state) {
  GradSync one_process;
  save_checkpoint(dir, &model, vocab_json, logical_optimizer_state(optimizer, one_process, model, true), state, {});
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

std::vector<std::pair<std::string, int64_t>> logical_sizes(const nn::Module& model) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& [name, p] : model.named_parameters()) {
    int64_t n = 1;
    for (int64_t d : logical_shape(model, name, p)) n *= d;
    out.emplace_back(name, n);
  }
  return out;
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
  if (state.scaler)
    st["grad_scaler"] = {{"scale", state.scaler->scale},
                         {"clean_steps", state.scaler->clean_steps},
                         {"overflows_left", state.scaler->overflows_left},
                         {"skipped_steps", state.scaler->skipped_steps}};
  nn::write_text_file_atomically((tmp / kStateFile).string(), st.dump(2));

  Manifest manifest;
  std::vector<std::string> files{kModelFile, "config.json", kStateFile};
  for (int i = 0; i < writer.count; ++i) files.push_back(optimizer_file_name(i, writer.count));
  for (const std::string& f : files) {
    MINIDL_CHECK(fs::exists(tmp / f), "checkpoint ", tmp.string(), ": ", f, " was not written");
    manifest[f] = {uint64_t(fs::file_size(tmp / f)), fnv1a64_of_file((tmp / f).string())};
  }
  nn::write_text_file_atomically((tmp / kManifestFile).string(), manifest_json(manifest));
  nn::write_text_file_atomically((tmp / kDoneFile).string(), "complete\n");
  fs::rename(tmp, dir);
}

Checkpoint load_checkpoint(const std::string& dir) {
  MINIDL_CHECK(fs::is_directory(dir), "--resume: ", dir, " is not a checkpoint directory");
  MINIDL_CHECK(fs::exists(fs::path(dir) / kDoneFile), "checkpoint ", dir,
               ": incomplete (no DONE marker: the save did not finish)");
  const std::string manifest_path = (fs::path(dir) / kManifestFile).string();
  MINIDL_CHECK(fs::exists(manifest_path), "checkpoint ", dir, ": missing ", kManifestFile);
  const Manifest manifest = parse_manifest(manifest_path, read_text(manifest_path));
  // The optimizer files: one, or count of them, each named with its index and the count.
  std::vector<std::string> optimizer_files;
  if (manifest.count(kOptimizerFile)) {
    optimizer_files.push_back(kOptimizerFile);
  } else {
    int index = -1, count = 0;
    for (const auto& [f, e] : manifest)
      if (std::sscanf(f.c_str(), "optimizer-%d-of-%d.safetensors", &index, &count) == 2) break;
    MINIDL_CHECK(count > 0, "checkpoint ", manifest_path, ": no entry for ", kOptimizerFile, " or its shards (",
                 optimizer_file_name(0, 2), ", ...)");
    for (int i = 0; i < count; ++i) optimizer_files.push_back(optimizer_file_name(i, count));
  }
  std::vector<std::string> files{kModelFile, kStateFile};
  files.insert(files.end(), optimizer_files.begin(), optimizer_files.end());
  for (const std::string& f : files) {
    const fs::path p = fs::path(dir) / f;
    auto e = manifest.find(f);
    MINIDL_CHECK(e != manifest.end(), "checkpoint ", manifest_path, ": no entry for ", f);
    MINIDL_CHECK(fs::exists(p), "checkpoint ", dir, ": missing file ", f);
    const uint64_t bytes = fs::file_size(p);
    MINIDL_CHECK(bytes == e->second.bytes, "checkpoint ", p.string(), ": ", bytes, " bytes where the manifest says ",
                 e->second.bytes, " (truncated or replaced)");
    const std::string sum = fnv1a64_of_file(p.string());
    MINIDL_CHECK(sum == e->second.fnv1a64, "checkpoint ", p.string(), ": checksum ", sum,
                 " where the manifest says ", e->second.fnv1a64, " (corrupted)");
  }
  Checkpoint c;
  c.dir = dir;
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
    if (st.contains("grad_scaler")) {
      const auto& g = st["grad_scaler"];
      c.state.scaler = optim::GradScalerState{g.at("scale").get<double>(), g.at("clean_steps").get<int64_t>(),
                                              g.at("overflows_left").get<int64_t>(),
                                              g.at("skipped_steps").get<int64_t>()};
    }
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

void restore_checkpoint(const Checkpoint& c, nn::GPT& model, optim::AdamW& optimizer) {
  GradSync one_process;
  restore_model(c, model);
  restore_optimizer(c, model, optimizer, one_process);
}

void restore_model(const Checkpoint& c, nn::GPT& model) {
  nn::GPTConfig want = model.config(), have = c.model_config;
  want.dropout = have.dropout = 0;  // dropout is a training choice, not the model's shape
  MINIDL_CHECK(want == have, "checkpoint ", c.dir, ": its model (", nn::gpt_config_to_json(c.model_config),
               ") is not the one configured (", nn::gpt_config_to_json(model.config()), ")");
  const std::string path = (fs::path(c.dir) / kModelFile).string();
  if (auto* split = dynamic_cast<dist::TensorParallelGPT*>(&model))
    dist::load_tensor_parallel_gpt(*split, path);  // this rank's slices of the whole tensors
  else
    nn::load_into(model, path);
}

std::shared_ptr<const nn::GPT> consolidated_model(const nn::GPT& model, bool keep) {
  auto* split = dynamic_cast<const dist::TensorParallelGPT*>(&model);
  if (!split) return keep ? std::shared_ptr<const nn::GPT>(&model, [](const nn::GPT*) {}) : nullptr;
  nn::StateDict whole = split->gather_state_dict();  // collective over the tp group
  if (!keep) return nullptr;
  auto one = std::make_shared<nn::GPT>(model.config());
  one->load_state_dict(whole, /*strict=*/true);
  return one;
}

void restore_optimizer(const Checkpoint& c, const nn::Module& model, optim::AdamW& optimizer, GradSync& sync) {
  std::map<std::string, Tensor> m_of, v_of;
  for (const auto& [name, p] : model.named_parameters()) {
    auto im = c.exp_avg.find(name), iv = c.exp_avg_sq.find(name);
    MINIDL_CHECK(im != c.exp_avg.end() && iv != c.exp_avg_sq.end(), "checkpoint ", c.dir, "/", kOptimizerFile,
                 ": no optimizer state for ", name);
    const Shape want = logical_shape(model, name, p);
    MINIDL_CHECK(im->second.shape() == want && iv->second.shape() == want, "checkpoint ", c.dir, "/",
                 kOptimizerFile, ": optimizer state for ", name, " has shape ", im->second.shape(), ", expected ",
                 want);
    m_of[name] = im->second;
    v_of[name] = iv->second;
  }
  Tensor m = Tensor::zeros({optimizer.numel()}), v = Tensor::zeros({optimizer.numel()});
  sync.load_logical_state(optimizer, m, model, m_of);
  sync.load_logical_state(optimizer, v, model, v_of);
  const Device device = optimizer.state().m.device();
  optimizer.load_state({c.optimizer_step, m.to(device), v.to(device)});
}

std::optional<std::string> latest_checkpoint(const std::string& parent,
                                             const std::function<void(const std::string&)>& log) {
  if (!fs::is_directory(parent)) return std::nullopt;
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(parent))
    if (is_step_dir(e.path())) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (fs::exists(*it / kDoneFile)) return it->string();
    log("skipping " + it->string() + ": incomplete (no DONE marker)");
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

}  // namespace minidl::train
