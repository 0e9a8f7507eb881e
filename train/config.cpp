#include "train/config.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "data/token_shards.h"
#include "dist/parameter_server.h"
#include "train/cuda_graph.h"
#include "train/parallel_model.h"
#include "train/progress.h"
#include "train/zero_memory.h"

namespace minidl::train {

namespace {

template <class T>
std::string str(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

int dp_size(const TrainConfig& c, int world) {
  return c.dp > 0 ? c.dp : std::max(1, world / (std::max(1, c.cp) * c.tp * c.pp * std::max(1, c.replica_groups)));
}

DType amp_dtype(const std::string& amp) {
  if (amp == "bf16") return DType::bf16;
  if (amp == "fp16") return DType::f16;
  MINIDL_CHECK(amp == "off", "--amp: expected off, bf16 or fp16, got '", amp, "'");
  return DType::f32;
}

void TrainConfig::validate_outer_sync(int world) const {
  MINIDL_CHECK(sync == "ddp" || sync == "local-sgd" || sync == "diloco",
               "--sync: expected ddp, local-sgd or diloco, got '", sync, "'");
  MINIDL_CHECK(sync_every >= 1, "--sync-every: expected a positive number of steps between syncs, got ", sync_every);
  MINIDL_CHECK(replica_groups >= 1, "--replica-groups: expected at least 1, got ", replica_groups);
  MINIDL_CHECK(world % replica_groups == 0, "--replica-groups ", replica_groups, " does not divide the ", world,
               " ranks this job runs on (mpirun -n): every replica holds the same layout");
  MINIDL_CHECK(outer_comm_hook == "none" || outer_comm_hook == "bf16" || outer_comm_hook == "fp16",
               "--outer-comm-hook: expected none, bf16 or fp16, got '", outer_comm_hook, "'");
  MINIDL_CHECK(comm_hook == "none" || comm_hook == "bf16" || comm_hook == "fp16" || powersgd_rank() > 0,
               "--comm-hook: expected none, bf16, fp16 or powersgd[:RANK], got '", comm_hook, "'");
  MINIDL_CHECK(!powersgd_start || *powersgd_start >= 0, "--powersgd-start: expected a number of steps >= 0, got ",
               powersgd_start.value_or(0));
  MINIDL_CHECK(powersgd_rank() == 0 || device == "cpu", "--comm-hook ", comm_hook,
               " runs on the CPU (its compression is host code); with --device ", device, " use bf16 or fp16");
  MINIDL_CHECK(comm_hook == "none" || zero == 0, "--comm-hook ", comm_hook, " with --zero ", zero,
               ": the hook compresses DDP's all-reduce, and ZeRO reduce-scatters its gradients instead");
  MINIDL_CHECK(outer_comm_hook == "none" || sync == "diloco", "--outer-comm-hook ", outer_comm_hook,
               " needs --sync diloco: it compresses the pseudo-gradients (local SGD averages the parameters "
               "themselves; diloco with --outer-lr 1 --outer-momentum 0 is local SGD)");
  if (sync == "ddp") {
    MINIDL_CHECK(replica_groups == 1, "--replica-groups ", replica_groups,
                 " needs --sync local-sgd or diloco (--sync ddp synchronises every rank every step)");
    MINIDL_CHECK(sync_every == 1, "--sync-every ", sync_every, " needs --sync local-sgd or diloco");
    return;
  }
  MINIDL_CHECK(zero <= 2, "--sync ", sync,
               " with --zero 3: the outer step needs each rank's whole parameters, which "
               "ZeRO-3 shards between steps; use --zero 1 or 2 inside a replica");
  MINIDL_CHECK(!cuda_graph, "--sync ", sync,
               " with --cuda-graph: the outer step writes the parameters outside the graph");
  MINIDL_CHECK(outer_lr > 0 && std::isfinite(outer_lr), "--outer-lr: expected a positive number, got ", outer_lr);
  MINIDL_CHECK(outer_momentum >= 0 && outer_momentum < 1, "--outer-momentum: expected a value in [0, 1), got ",
               outer_momentum);
}

int TrainConfig::powersgd_rank() const {
  if (comm_hook == "powersgd") return 4;
  if (comm_hook.rfind("powersgd:", 0) != 0) return 0;
  int rank = 0;
  char extra = 0;
  MINIDL_CHECK(std::sscanf(comm_hook.c_str(), "powersgd:%d%c", &rank, &extra) == 1 && rank >= 1, "--comm-hook ",
               comm_hook, ": expected powersgd:RANK with RANK >= 1");
  return rank;
}

std::pair<int, int> TrainConfig::injected_delay() const {
  if (inject_delay.empty()) return {-1, 0};
  int rank = -1, ms = -1;
  char extra = 0;
  MINIDL_CHECK(std::sscanf(inject_delay.c_str(), "%d:%d%c", &rank, &ms, &extra) == 2 && rank >= 0 && ms >= 0,
               "--inject-delay: expected RANK:MS (a rank and milliseconds, both >= 0), got '", inject_delay, "'");
  return {rank, ms};
}

void TrainConfig::validate_parameter_server(int world) const {
  MINIDL_CHECK(ps >= 0, "--ps: expected a number of server ranks >= 0, got ", ps);
  MINIDL_CHECK(
      backup_workers == 0 || (ps == 1 && ps_mode == "sync" && backup_workers > 0 && backup_workers < world - ps),
      "--backup-workers ", backup_workers,
      ": expected 1 .. workers - 1 with --ps 1 --ps-mode sync (each step "
      "takes the first workers - b gradients; this job has ",
      std::max(0, world - ps), " workers)");
  const bool on = ps > 0 || !ps_replay.empty();
  MINIDL_CHECK(on || (ps_mode == "sync" && ps_log.empty()), ps_log.empty() ? "--ps-mode" : "--ps-log",
               " needs --ps S (the server ranks)");
  if (!on) return;
  dist::ps_options(ps_mode);  // names the accepted modes
  MINIDL_CHECK(ps_replay.empty() || (ps == 0 && world == 1),
               "--ps-replay replays a run in one process: without --ps, "
               "on one rank (it got --ps ",
               ps, " on ", world, " ranks)");
  MINIDL_CHECK(ps_replay.empty() || std::filesystem::is_regular_file(ps_replay), "--ps-replay: ", ps_replay,
               " is not a file");
  MINIDL_CHECK(ps == 0 || world > ps, "--ps ", ps, " leaves no worker among the ", world, " ranks: mpirun -n ", ps + 1,
               " or more");
  const char* flag = ps > 0 ? "--ps" : "--ps-replay";
  MINIDL_CHECK(tp == 1 && pp == 1 && cp == 1 && zero == 0 && sync == "ddp" && replica_groups == 1, flag,
               " trains whole models on its workers: not with --tp, --pp, --cp, --zero, --sync or --replica-groups");
  MINIDL_CHECK(dp == 0, flag, ": the workers are the data-parallel ranks (every rank but the servers); drop --dp");
  MINIDL_CHECK(comm_hook == "none", flag, " with --comm-hook ", comm_hook, ": the workers push f32 gradients");
  MINIDL_CHECK(checkpoint_dir.empty() && resume.empty(), flag,
               " with --checkpoint-dir or --resume: the servers' "
               "state is not checkpointed yet");
  MINIDL_CHECK(amp != "fp16" && !cuda_graph && device == "cpu", flag,
               " runs on the CPU in f32 or bf16 (no fp16 loss scaling, no CUDA graphs)");
  MINIDL_CHECK(dropout == 0, flag, " with --dropout ", dropout,
               ": a replayed gradient must see the same masks; use --dropout 0");
  MINIDL_CHECK(grad_clip == 0 || ps <= 1, "--ps ", ps, " with --grad-clip ", grad_clip,
               ": clipping needs the whole gradient's norm, which only one server holds; use --ps 1 or --grad-clip 0");
}

void TrainConfig::validate_moe() const {
  MINIDL_CHECK(moe_experts >= 0, "--moe-experts: expected 0 (dense) or more experts, got ", moe_experts);
  MINIDL_CHECK(ep >= 1, "--ep: expected at least 1, got ", ep);
  MINIDL_CHECK(ep == 1 || moe_experts > 0, "--ep ", ep,
               " spreads a mixture of experts' experts: it needs --moe-experts");
  if (moe_experts == 0) {
    MINIDL_CHECK(moe_top_k == 2 && moe_every == 1 && moe_shared == 0 && moe_router == "softmax" &&
                     moe_balance == "aux" && !moe_capacity,
                 "--moe-top-k, --moe-every, --moe-shared, --moe-router, --moe-balance and --moe-capacity shape a ",
                 "mixture of experts: they need --moe-experts");
    return;
  }
  MINIDL_CHECK(model == "llama", "--moe-experts ", moe_experts, ": a mixture of experts has SwiGLU experts; it needs ",
               "--model llama, got --model ", model.empty() ? "gpt2 (the default)" : model);
  MINIDL_CHECK(moe_top_k >= 1 && moe_top_k <= moe_experts, "--moe-top-k: expected 1 to --moe-experts ", moe_experts,
               " experts per token, got ", moe_top_k);
  MINIDL_CHECK(moe_every >= 1, "--moe-every: expected at least 1 (every block), got ", moe_every);
  MINIDL_CHECK(moe_shared >= 0, "--moe-shared: expected 0 or more shared experts, got ", moe_shared);
  MINIDL_CHECK(moe_router == "softmax" || moe_router == "sigmoid", "--moe-router: expected softmax or sigmoid, got '",
               moe_router, "'");
  MINIDL_CHECK(moe_balance == "aux" || moe_balance == "bias" || moe_balance == "none",
               "--moe-balance: expected aux, bias or none, got '", moe_balance, "'");
  MINIDL_CHECK(!moe_capacity || (*moe_capacity > 0 && std::isfinite(*moe_capacity)),
               "--moe-capacity: expected a capacity factor above 0 (leave it out for dropless), got ",
               moe_capacity.value_or(0));
  MINIDL_CHECK(moe_aux_coef >= 0 && std::isfinite(moe_aux_coef), "--moe-aux-coef: expected 0 or more, got ",
               moe_aux_coef);
  MINIDL_CHECK(moe_bias_rate >= 0 && std::isfinite(moe_bias_rate), "--moe-bias-rate: expected 0 or more, got ",
               moe_bias_rate);
  // What is not built yet is refused by name, never run wrong.
  MINIDL_CHECK(tp == 1, "--moe-experts with --tp ", tp, ": the experts are not split by tensor parallelism yet");
  MINIDL_CHECK(cp == 1, "--moe-experts with --cp ", cp,
               ": the auxiliary loss and the capacity count a whole sequence's tokens, which a context-parallel "
               "rank does not hold");
  MINIDL_CHECK(sync == "ddp" && ps == 0, "--moe-experts with ", ps > 0 ? "--ps" : "--sync " + sync,
               ": not built (the bias balancing's counts are summed over the data-parallel group)");
  MINIDL_CHECK(!cuda_graph, "--moe-experts with --cuda-graph: the router's choice is made on the host every step");
  if (ep == 1) return;
  MINIDL_CHECK(moe_experts % ep == 0, "--ep ", ep, " must divide --moe-experts ", moe_experts,
               " (each rank holds the same number of experts)");
  MINIDL_CHECK(zero == 0, "--ep with --zero ", zero, ": ZeRO does not shard the experts' own group yet");
  MINIDL_CHECK(pp == 1, "--ep with --pp ", pp, ": gathering spread experts across pipeline stages is not built yet");
}

void TrainConfig::validate_context_parallel() const {
  MINIDL_CHECK(cp >= 1, "--cp: expected at least 1, got ", cp);
  if (cp == 1) return;
  MINIDL_CHECK(seq_or_default() % (2 * cp) == 0, "--cp ", cp, ": the sequence length ", seq_or_default(),
               " (--seq) must be a multiple of 2 x --cp = ", 2 * cp,
               " (each rank holds two of 2 x cp chunks, one from each end: equal causal work)");
  // What is not built yet is refused by name, never run wrong.
  MINIDL_CHECK(!sequence_parallel,
               "--cp with --sequence-parallel: both split the sequence (over cp ranks, then "
               "over tp); not built: use --tp without --sequence-parallel");
  MINIDL_CHECK(sync == "ddp", "--cp with --sync ", sync, ": not built (the outer syncs are tested without --cp)");
}

void TrainConfig::validate(int world) const {
  validate_parameter_server(world);
  if (!tokenizer.empty()) data::Tokenizer::check_kind(tokenizer);
  MINIDL_CHECK(injected_delay().first < world, "--inject-delay ", inject_delay, ": rank ", injected_delay().first,
               " is not among the ", world, " ranks");
  if (ps > 0) world -= ps;  // the layout below is the workers'
  MINIDL_CHECK(tp >= 1, "--tp: expected at least 1, got ", tp);
  MINIDL_CHECK(pp >= 1, "--pp: expected at least 1, got ", pp);
  MINIDL_CHECK(dp >= 0, "--dp: expected at least 1, got ", dp);
  MINIDL_CHECK(heads_or_default() % tp == 0, "--tp ", tp, " must divide --heads ", heads_or_default(),
               " (attention is split by heads)");
  MINIDL_CHECK(!kv_heads || *kv_heads % tp == 0, "num_key_value_heads ", kv_heads.value_or(0),
               " is not divisible by --tp ", tp, " (each rank holds whole key/value heads)");
  MINIDL_CHECK(!sequence_parallel || tp > 1,
               "--sequence-parallel splits the sequence over the tensor-parallel "
               "ranks: it needs --tp 2 or more, got --tp ",
               tp);
  MINIDL_CHECK(!sequence_parallel || seq_or_default() % tp == 0, "--sequence-parallel: --seq ", seq_or_default(),
               " must be a multiple of --tp ", tp);
  validate_context_parallel();
  validate_moe();
  MINIDL_CHECK(!memory_report || pp == 1, "--memory-report with --pp ", pp,
               ": the prediction is per whole model "
               "(or its tensor-parallel split), not per pipeline stage; the summary's act_peak_mb, param_mb, "
               "grad_mb and optim_mb and the per-stage activation peaks are measured");
  if (cuda_graph) validate_cuda_graph(*this, world);
  validate_outer_sync(world);
  const int d = dp_size(*this, world), r = replica_groups;
  MINIDL_CHECK(int64_t(d) * cp * tp * pp * r == world, "--dp ", d, cp > 1 ? " x --cp " + std::to_string(cp) : "",
               " x --tp ", tp, " x --pp ", pp, r > 1 ? " x --replica-groups " + std::to_string(r) : std::string(),
               " = ", int64_t(d) * cp * tp * pp * r, " does not match the ", world,
               " ranks this job runs on (mpirun -n)");
  // The global batch splits into (replicas x) dp ranks x micro-batches of equal size.
  MINIDL_CHECK(batch >= 1, "--batch: expected at least 1, got ", batch);
  validate_pipeline(*this, d * r);
  MINIDL_CHECK(d % ep == 0, "--ep ", ep, " must divide the data-parallel size ", d,
               " (an ep group is ep of the dp ranks)");
  MINIDL_CHECK(zero >= 0 && zero <= 3, "--zero: expected 0, 1, 2 or 3, got ", zero);
  MINIDL_CHECK(backend.empty() || backend == "mpi" || backend == "ring" || backend == "nccl",
               "--backend: expected mpi, ring or nccl, got '", backend, "'");
  MINIDL_CHECK(layers_or_default() >= 1, "--layers: expected at least 1, got ", layers_or_default());
  MINIDL_CHECK(heads_or_default() >= 1, "--heads: expected at least 1, got ", heads_or_default());
  MINIDL_CHECK(embd_or_default() >= 1 && (head_dim || embd_or_default() % heads_or_default() == 0),
               "--embd: expected a positive multiple of --heads (", heads_or_default(),
               ") unless --head-dim is given, got ", embd_or_default());
  MINIDL_CHECK(model.empty() || model == "gpt2" || model == "llama", "--model: expected gpt2 or llama, got '", model,
               "'");
  if (model != "llama")
    MINIDL_CHECK(!kv_heads && !head_dim && !ffn && !untie && rope_theta == 10000.0 && norm_eps == 1e-5,
                 "--kv-heads, --head-dim, --ffn, --rope-theta, --norm-eps and --untie shape a Llama: they need --model "
                 "llama");
  if (kv_heads) {
    MINIDL_CHECK(*kv_heads >= 1 && heads_or_default() % *kv_heads == 0, "--kv-heads: expected a divisor of --heads ",
                 heads_or_default(), " (each key/value head serves heads / kv-heads query heads), got ", *kv_heads);
  }
  MINIDL_CHECK(!head_dim || (*head_dim >= 2 && *head_dim % 2 == 0), "--head-dim: expected a positive even width ",
               "(RoPE turns pairs), got ", head_dim.value_or(0));
  MINIDL_CHECK(!ffn || *ffn >= 1, "--ffn: expected at least 1, got ", ffn.value_or(0));
  MINIDL_CHECK(seq_or_default() >= 1, "--seq: expected at least 1, got ", seq_or_default());
  MINIDL_CHECK(steps >= 0, "--steps: expected 0 or more, got ", steps);
  MINIDL_CHECK(steps > 0 || !init_from.empty(), "--steps 0 only evaluates, which needs --init-from");
  MINIDL_CHECK(save_every >= 0, "--save-every: expected 0 (off) or a positive number of steps, got ", save_every);
  MINIDL_CHECK(keep_last >= 0, "--keep-last: expected 0 (all) or a positive count, got ", keep_last);
  MINIDL_CHECK(!checkpoint_dir.empty() || (save_every == 0 && resume != "auto"),
               save_every > 0 ? "--save-every" : "--resume auto", " needs --checkpoint-dir");
  MINIDL_CHECK(resume.empty() || init_from.empty(),
               "--resume and --init-from exclude each other: --resume continues "
               "a run (weights, optimizer, schedule, data position), --init-from starts a new one from weights");
  MINIDL_CHECK(lr > 0 && std::isfinite(lr), "--lr: expected a positive number, got ", lr);
  MINIDL_CHECK(!min_lr || (*min_lr >= 0 && *min_lr <= lr), "--min-lr: expected a value in [0, --lr = ", lr, "], got ",
               min_lr.value_or(0));
  MINIDL_CHECK(warmup >= 0 && warmup <= steps, "--warmup: expected 0 to --steps (", steps, "), got ", warmup);
  MINIDL_CHECK(weight_decay >= 0, "--weight-decay: expected 0 or more, got ", weight_decay);
  MINIDL_CHECK(dropout >= 0 && dropout < 1, "--dropout: expected a probability in [0, 1), got ", dropout);
  MINIDL_CHECK(grad_clip >= 0, "--grad-clip: expected 0 (off) or a positive norm, got ", grad_clip);
  MINIDL_CHECK(threads >= 0, "--threads: expected a positive count, got ", threads);
  MINIDL_CHECK(eval_every >= 0, "--eval-every: expected 0 or more, got ", eval_every);
  MINIDL_CHECK(eval_windows >= 1, "--eval-windows: expected at least 1, got ", eval_windows);
  MINIDL_CHECK(log_every >= 1, "--log-every: expected at least 1, got ", log_every);
  MINIDL_CHECK(sample >= 0, "--sample: expected 0 or more, got ", sample);
  MINIDL_CHECK(max_skipped_steps >= 1, "--max-skipped-steps: expected at least 1, got ", max_skipped_steps);
  MINIDL_CHECK(loss_scale_init >= 1 && loss_scale_init <= 16777216.0,
               "--loss-scale-init: expected a scale from 1 to 2^24 (16777216), got ", loss_scale_init);
  MINIDL_CHECK(loss_scale_growth_interval >= 1, "--loss-scale-growth-interval: expected at least 1, got ",
               loss_scale_growth_interval);
  parse_progress_mode(progress);
  amp_dtype(amp);
  nn::parse_recompute(recompute);
  MINIDL_CHECK(temperature >= 0, "--temperature: expected 0 (greedy) or a positive number, got ", temperature);
  MINIDL_CHECK(top_k >= 0, "--top-k: expected 0 (every token) or more, got ", top_k);
  MINIDL_CHECK(!collective_timeout || (*collective_timeout >= 0 && std::isfinite(*collective_timeout)),
               "--collective-timeout: expected 0 (off) or a number of seconds, got ", collective_timeout.value_or(0));
  if (!checkpoint_dir.empty() && std::filesystem::exists(checkpoint_dir))
    MINIDL_CHECK(std::filesystem::is_directory(checkpoint_dir), "--checkpoint-dir: ", checkpoint_dir,
                 " exists and is not a directory");
  if (!save.empty()) {
    auto dir = std::filesystem::absolute(save).parent_path();
    MINIDL_CHECK(std::filesystem::is_directory(dir), "--save: directory ", dir.string(), " does not exist");
  }
}

data::TextDataset open_dataset(const TrainConfig& o, const data::Tokenizer* saved) {
  const bool shards = data::names_token_shards(o.data);
  // Token shards hold GPT-2's ids (llm.c's scripts): they default to its tokenizer.
  const std::string kind = saved                  ? saved->kind()
                           : !o.tokenizer.empty() ? data::Tokenizer::kind_of(o.tokenizer)
                           : shards               ? "gpt2"
                                                  : "char";
  if (shards) {
    MINIDL_CHECK(kind == "gpt2", "--data ", o.data, ": token shards hold GPT-2's ids, expected --tokenizer gpt2, got ",
                 kind);
    return data::TextDataset::from_shards(o.data, saved ? *saved : data::Tokenizer::gpt2(o.gpt2_encoding));
  }
  if (saved) return data::TextDataset(o.data, *saved);
  if (kind == "gpt2") return data::TextDataset(o.data, data::Tokenizer::gpt2(o.gpt2_encoding));
  if (kind == "hf") return data::TextDataset(o.data, data::Tokenizer::hf_file(o.tokenizer));
  return data::TextDataset(o.data);
}

std::string plan_memory(const TrainConfig& o, int world, double gib) {
  MINIDL_CHECK(gib > 0 && std::isfinite(gib), "--plan-memory: expected a positive number of GiB, got ", gib);
  const data::TextDataset ds = open_dataset(o, nullptr);
  const nn::GPTConfig m = model_config(o, int64_t(ds.tokenizer().size()), nullptr, "");
  m.validate();
  return memory_plan(m, dp_size(o, world), amp_dtype(o.amp), o.batch, gib * double(1ull << 30));
}

// Flags given explicitly must agree with the checkpoint.
nn::GPTConfig model_config(const TrainConfig& cfg, int64_t vocab, const nn::GPTConfig* checkpoint,
                           const std::string& ckpt_source) {
  nn::GPTConfig m{
      vocab, cfg.seq_or_default(), cfg.layers_or_default(), cfg.heads_or_default(), cfg.embd_or_default(), cfg.dropout,
      true,  cfg.vocab_pad};
  if (cfg.model == "llama") {
    m.arch = nn::GPTConfig::Arch::kLlama;
    m.bias = false;
    m.n_kv_head = cfg.kv_heads.value_or(0);
    m.head_dim = cfg.head_dim.value_or(0);
    m.intermediate_size = cfg.ffn.value_or(0);
    m.rope_theta = cfg.rope_theta;
    m.norm_eps = cfg.norm_eps;
    m.tie_embeddings = !cfg.untie;
    m.moe_experts = cfg.moe_experts;
    m.moe_top_k = cfg.moe_top_k;
    m.moe_every = cfg.moe_every;
    m.moe_shared = cfg.moe_shared;
    m.moe_router = cfg.moe_router == "sigmoid" ? nn::GPTConfig::Router::kSigmoid : nn::GPTConfig::Router::kSoftmax;
    m.moe_balance = cfg.moe_balance == "bias"   ? nn::GPTConfig::Balance::kBias
                    : cfg.moe_balance == "none" ? nn::GPTConfig::Balance::kNone
                                                : nn::GPTConfig::Balance::kAux;
    m.moe_aux_coef = cfg.moe_aux_coef;
    m.moe_bias_rate = cfg.moe_bias_rate;
    m.moe_capacity = cfg.moe_capacity.value_or(0);
  }
  if (!checkpoint) return m;
  const nn::GPTConfig& c = *checkpoint;
  MINIDL_CHECK(cfg.model.empty() || (cfg.model == "llama") == c.llama(), "--model ", cfg.model,
               " does not match the checkpoint ", ckpt_source, ", which is ", c.llama() ? "llama" : "gpt2");
  auto agree = [&](const char* flag, const std::optional<int64_t>& given, int64_t stored) {
    MINIDL_CHECK(!given || *given == stored, flag, " ", *given, " does not match the checkpoint ", ckpt_source,
                 ", which has ", stored);
  };
  agree("--layers", cfg.layers, c.n_layer);
  agree("--heads", cfg.heads, c.n_head);
  agree("--embd", cfg.embd, c.n_embd);
  agree("--kv-heads", cfg.kv_heads, c.kv_heads());
  agree("--head-dim", cfg.head_dim, c.head_size());
  agree("--ffn", cfg.ffn, c.mlp_width());
  MINIDL_CHECK(cfg.moe_experts == 0 || cfg.moe_experts == c.moe_experts, "--moe-experts ", cfg.moe_experts,
               " does not match the checkpoint ", ckpt_source, ", which has ", c.moe_experts);
  // With --moe-experts given, the other --moe-* flags describe the same mixture (they have defaults, so given or
  // not they must agree); without it the checkpoint's settings are taken whole.
  if (cfg.moe_experts > 0) {
    auto same = [&](const char* flag, const auto& given, const auto& stored) {
      MINIDL_CHECK(given == stored, flag, " ", given, " does not match the checkpoint ", ckpt_source, ", which has ",
                   stored, " (leave out every --moe-* flag to take the checkpoint's)");
    };
    auto router = [](nn::GPTConfig::Router r) { return r == nn::GPTConfig::Router::kSigmoid ? "sigmoid" : "softmax"; };
    auto balance = [](nn::GPTConfig::Balance b) {
      return b == nn::GPTConfig::Balance::kBias ? "bias" : b == nn::GPTConfig::Balance::kNone ? "none" : "aux";
    };
    same("--moe-top-k", m.moe_top_k, c.moe_top_k);
    same("--moe-every", m.moe_every, c.moe_every);
    same("--moe-shared", m.moe_shared, c.moe_shared);
    same("--moe-router", std::string(router(m.moe_router)), std::string(router(c.moe_router)));
    same("--moe-balance", std::string(balance(m.moe_balance)), std::string(balance(c.moe_balance)));
    same("--moe-aux-coef", m.moe_aux_coef, c.moe_aux_coef);
    same("--moe-bias-rate", m.moe_bias_rate, c.moe_bias_rate);
    same("--moe-capacity", m.moe_capacity, c.moe_capacity);
  }
  MINIDL_CHECK(!cfg.seq || *cfg.seq <= c.block_size, "--seq ", cfg.seq.value_or(0), " is longer than the checkpoint ",
               ckpt_source, "'s block size ", c.block_size);
  m = c;
  m.dropout = cfg.dropout;
  m.vocab_pad = cfg.vocab_pad;  // a layout choice, not stored in checkpoints
  return m;
}

std::vector<std::pair<std::string, std::string>> agreed_fields(const TrainConfig& o, const data::TextDataset& ds) {
  auto opt = [](const std::optional<int64_t>& v) { return v ? str(*v) : std::string("default"); };
  return {{"data", o.data + " (" + str(ds.train_tokens()) + " train tokens)"},
          {"tokenizer", ds.tokenizer().kind()},
          {"layers", opt(o.layers)},
          {"heads", opt(o.heads)},
          {"embd", opt(o.embd)},
          {"seq", opt(o.seq)},
          {"vocab_pad", str(o.vocab_pad)},
          {"batch", str(o.batch)},
          {"steps", str(o.steps)},
          {"lr", str(o.lr)},
          {"min_lr", str(o.min_lr.value_or(-1))},
          {"warmup", str(o.warmup)},
          {"weight_decay", str(o.weight_decay)},
          {"dropout", str(o.dropout)},
          {"grad_clip", str(o.grad_clip)},
          {"seed", str(o.seed)},
          {"init_from", o.init_from},
          {"backend", o.backend},
          {"dp", str(o.dp)},
          {"tp", str(o.tp)},
          {"pp", str(o.pp)},
          {"cp", str(o.cp)},
          {"ep", str(o.ep)},
          {"moe", str(o.moe_experts) + "/" + str(o.moe_top_k) + "/" + str(o.moe_every) + "/" + str(o.moe_shared) + "/" +
                      o.moe_router + "/" + o.moe_balance + "/" + str(o.moe_aux_coef) + "/" + str(o.moe_bias_rate) +
                      "/" + str(o.moe_capacity.value_or(0))},
          {"sequence_parallel", str(o.sequence_parallel)},
          {"zero", str(o.zero)},
          {"sync", o.sync},
          {"sync_every", str(o.sync_every)},
          {"replica_groups", str(o.replica_groups)},
          {"outer_lr", str(o.outer_lr)},
          {"outer_momentum", str(o.outer_momentum)},
          {"nesterov", str(o.nesterov)},
          {"comm_hook", o.comm_hook},
          {"powersgd_start", opt(o.powersgd_start)},
          {"inject_delay", o.inject_delay},
          {"ps", str(o.ps)},
          {"ps_mode", o.ps_mode},
          {"backup_workers", str(o.backup_workers)},
          {"outer_comm_hook", o.outer_comm_hook},
          {"amp", o.amp},
          {"recompute", o.recompute},
          {"device", o.device},
          {"tf32", str(o.tf32)},
          {"advance_lr_on_skip", str(o.advance_lr_on_skip)},
          {"checkpoint_dir", o.checkpoint_dir},
          {"save_every", str(o.save_every)},
          {"micro_batches", opt(o.micro_batches)},
          {"schedule", o.schedule},
          {"virtual_stages", str(o.virtual_stages)},
          {"pp_layers", o.pp_layers}};
}

}  // namespace minidl::train
