// minidl_predict: what a layout will do on N GPUs — step time split into compute, exposed communication per kind,
// pipeline bubble and optimizer; memory per GPU by tag; MFU, tokens/s and scaling efficiency against one GPU
// (predict/predict.h says how each is derived). --plan ranks every layout of --gpus GPUs instead.
//
//   build/bin/minidl_predict --machine a100-sxm --layers 24 --heads 16 --embd 2048 --seq 2048 --vocab 51200 \
//       --batch 512 --dp 4 --tp 8 --micro-batches 128 --amp bf16
//   build/bin/minidl_predict --machine h100-sxm --gpus 64 --plan ... --budget-gib 80
//   build/bin/minidl_predict --machine cpu-host --dp 2 --batch 24 --json   # after scripts/predict_calibrate.py
#include <CLI/CLI.hpp>

#include <cstdio>
#include <optional>
#include <string>

#include "core/error.h"
#include "predict/predict.h"
#include "predict/report.h"

using namespace minidl;

int main(int argc, char** argv) {
  int64_t layers = 4, heads = 4, embd = 128, seq = 64, vocab = 65, batch = 12, kv_heads = 0, ffn = 0;
  std::string model = "gpt2";
  predict::Layout l;
  std::string machine_name = "h100-sxm", machine_file, recompute = "none", amp = "off", schedule = "1f1b";
  int gpus = 0, plan_top = 20, plan_refused = 40, max_micro = 64;
  bool do_plan = false, json = false, list = false;
  double budget_gib = 0, peak_tflops = 0, mem_gib = 0, mem_bw_gbs = 0, intra_gbs = 0, inter_gbs = 0;
  double intra_alpha_us = -1, inter_alpha_us = -1;
  int gpus_per_node = 0;
  CLI::App app{
      "Predict the step time, memory and scaling efficiency of a GPT training layout on a machine, or rank "
      "every layout of --gpus GPUs (--plan)."};
  const CLI::Range positive{int64_t(1), int64_t(1) << 40};
  app.add_option("--model", model, "Architecture, as train_gpt's --model: gpt2 or llama")
      ->check(CLI::IsMember({"gpt2", "llama"}))
      ->capture_default_str();
  app.add_option("--kv-heads", kv_heads, "Llama: key/value heads, a divisor of --heads [default: --heads]")
      ->check(positive);
  app.add_option("--ffn", ffn, "Llama: the SwiGLU MLP's hidden width [default: 4 x --embd]")->check(positive);
  nn::GPTConfig moe;  // the --moe-* fields only
  std::string moe_balance = "aux";
  app.add_option("--moe-experts", moe.moe_experts,
                 "Llama: a mixture of experts, E SwiGLU experts per MoE block, as train_gpt's (0: dense)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 20))
      ->capture_default_str();
  app.add_option("--moe-top-k", moe.moe_top_k, "With --moe-experts: experts per token")
      ->check(positive)
      ->capture_default_str();
  app.add_option("--moe-every", moe.moe_every, "With --moe-experts: block i is MoE when i % n == 0")
      ->check(positive)
      ->capture_default_str();
  app.add_option("--moe-shared", moe.moe_shared, "With --moe-experts: shared experts every token passes through")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 20))
      ->capture_default_str();
  app.add_option("--moe-capacity", moe.moe_capacity,
                 "With --moe-experts: the capacity factor (slots per expert over tokens x k / E); 0: dropless")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--moe-balance", moe_balance, "With --moe-experts: aux, bias or none")
      ->check(CLI::IsMember({"aux", "bias", "none"}))
      ->capture_default_str();
  app.add_option("--ep", l.ep,
                 "Expert parallelism: the experts spread over groups of ep of the dp ranks (a divisor of --dp and "
                 "--moe-experts; not more GPUs)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--layers", layers, "Transformer blocks")->check(positive)->capture_default_str();
  app.add_option("--heads", heads, "Attention heads")->check(positive)->capture_default_str();
  app.add_option("--embd", embd, "Embedding width (a multiple of --heads)")->check(positive)->capture_default_str();
  app.add_option("--seq", seq, "Sequence length")->check(positive)->capture_default_str();
  app.add_option("--vocab", vocab, "Vocabulary size")->check(positive)->capture_default_str();
  app.add_option("--batch", batch, "Global batch: sequences per optimizer step over all data-parallel ranks")
      ->check(positive)
      ->capture_default_str();
  app.add_option("--dp", l.dp, "Data-parallel ranks")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--tp", l.tp, "Tensor-parallel ranks (must divide --heads)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--pp", l.pp, "Pipeline stages")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--cp", l.cp,
                 "Context-parallel ranks: each sequence over cp ranks, attention a ring (--seq a multiple of 2 x cp); "
                 "the gradients averaged over dp x cp")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--virtual-stages", l.virtual_stages,
                 "Model chunks per pipeline rank (> 1: with --schedule interleaved)")
      ->check(CLI::Range(1, 1 << 10))
      ->capture_default_str();
  app.add_option("--micro-batches", l.micro_batches,
                 "Micro-batches per step per data-parallel rank (gradient "
                 "accumulation when --pp 1)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--schedule", schedule,
                 "Pipeline schedule, as train_gpt's: gpipe, 1f1b or interleaved (1F1B over --virtual-stages > 1 "
                 "chunks per rank)")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved"}))
      ->capture_default_str();
  app.add_option("--zero", l.zero, "ZeRO stage 0 (DDP) to 3")->check(CLI::Range(0, 3))->capture_default_str();
  app.add_option("--recompute", recompute, "Activation checkpointing: none, attn, mlp or block")
      ->check(CLI::IsMember({"none", "attn", "mlp", "block"}))
      ->capture_default_str();
  app.add_option("--amp", amp, "Mixed precision: off (f32), bf16 or fp16")
      ->check(CLI::IsMember({"off", "bf16", "fp16"}))
      ->capture_default_str();
  app.add_flag("--sequence-parallel", l.sequence_parallel, "Sequence parallelism (with --tp > 1)");
  std::string sync = "ddp", ps_mode = "sync";
  app.add_option("--sync", sync,
                 "As train_gpt's: ddp (one synchronous group), local-sgd or diloco (--replica-groups copies of the "
                 "layout meet every --sync-every steps)")
      ->check(CLI::IsMember({"ddp", "local-sgd", "diloco"}))
      ->capture_default_str();
  app.add_option("--replica-groups", l.replicas, "With --sync local-sgd or diloco: the replicas R")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--sync-every", l.sync_every, "With --sync local-sgd or diloco: steps H between outer syncs")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--ps", l.ps_servers,
                 "Parameter-server ranks S beside --dp workers (train_gpt --ps S on dp + S ranks); 0: none")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--ps-mode", ps_mode, "With --ps: sync, async or ssp:S (SSP predicts as async: equal workers)")
      ->capture_default_str();
  app.add_option("--machine", machine_name,
                 "A preset: a100-sxm, h100-sxm, h200-sxm, a100-pcie, or cpu-host (the "
                 "calibrated host, predict/presets/cpu-host.json); --list-machines prints them")
      ->capture_default_str();
  app.add_option("--machine-file", machine_file,
                 "A machine from a JSON file (scripts/predict_calibrate.py writes "
                 "one); overrides --machine");
  app.add_flag("--list-machines", list, "Print the presets as JSON and exit");
  app.add_option("--gpus-per-node", gpus_per_node, "Override: ranks per node")->check(CLI::Range(1, 1 << 20));
  app.add_option("--peak-tflops", peak_tflops, "Override: dense TFLOP/s per GPU (for f32 and 16-bit products alike)")
      ->check(CLI::PositiveNumber);
  app.add_option("--mem-bw-gbs", mem_bw_gbs, "Override: memory bandwidth, GB/s")->check(CLI::PositiveNumber);
  app.add_option("--mem-gib", mem_gib, "Override: memory per GPU, GiB")->check(CLI::PositiveNumber);
  app.add_option("--intra-alpha-us", intra_alpha_us, "Override: intra-node latency α, µs")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--intra-gbs", intra_gbs, "Override: intra-node bandwidth β per GPU, one direction, GB/s")
      ->check(CLI::PositiveNumber);
  app.add_option("--inter-alpha-us", inter_alpha_us, "Override: inter-node latency α, µs")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--inter-gbs", inter_gbs, "Override: inter-node bandwidth β per GPU, one direction, GB/s")
      ->check(CLI::PositiveNumber);
  app.add_flag("--plan", do_plan,
               "Rank every valid layout of --gpus GPUs by predicted step time, and say why each "
               "invalid one is refused");
  app.add_option("--gpus", gpus, "With --plan: the GPU count (dp x tp x pp)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--budget-gib", budget_gib, "With --plan: memory per GPU, GiB (default: the machine's)")
      ->check(CLI::PositiveNumber);
  app.add_option("--plan-top", plan_top, "With --plan: valid layouts printed")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--plan-refused", plan_refused,
                 "With --plan: refused layouts printed one per line (the rest "
                 "counted by reason)")
      ->check(CLI::Range(0, 1 << 30))
      ->capture_default_str();
  app.add_option("--max-micro-batches", max_micro, "With --plan: the most micro-batches tried")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_flag("--json", json, "Print one JSON object instead of the table");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) { return app.exit(e); } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "minidl_predict: error: %s (see --help)\n", e.what());
    return 2;
  }
  try {
    if (list) {
      std::string all = "[";
      for (const predict::Machine& m : predict::machine_presets())
        all += (all.size() > 1 ? ",\n" : "\n") + predict::machine_to_json(m);
      std::printf("%s\n]\n", all.c_str());
      return 0;
    }
    predict::Machine m =
        machine_file.empty() ? predict::find_machine(machine_name) : predict::load_machine(machine_file);
    if (gpus_per_node > 0) m.gpus_per_node = gpus_per_node;
    if (peak_tflops > 0) m.peak_flops_16 = m.peak_flops_32 = peak_tflops * 1e12;
    if (mem_bw_gbs > 0) m.mem_bw = mem_bw_gbs * 1e9;
    if (mem_gib > 0) m.mem_capacity = mem_gib * double(1ull << 30);
    if (intra_alpha_us >= 0) m.intra.alpha = intra_alpha_us * 1e-6;
    if (inter_alpha_us >= 0) m.inter.alpha = inter_alpha_us * 1e-6;
    if (intra_gbs > 0) m.intra.beta = intra_gbs * 1e9;
    if (inter_gbs > 0) m.inter.beta = inter_gbs * 1e9;
    m.validate();
    predict::Workload w{nn::GPTConfig{vocab, seq, layers, heads, embd, 0.0, true}, batch};
    MINIDL_CHECK(model == "llama" || (kv_heads == 0 && ffn == 0),
                 "--kv-heads and --ffn shape a Llama: they need "
                 "--model llama");
    if (model == "llama") {
      w.model.arch = nn::GPTConfig::Arch::kLlama;
      w.model.bias = false;
      w.model.n_kv_head = kv_heads;
      w.model.intermediate_size = ffn;
    }
    MINIDL_CHECK(moe.moe_experts > 0 || (moe.moe_top_k == 2 && moe.moe_every == 1 && moe.moe_shared == 0 &&
                                         moe.moe_capacity == 0 && moe_balance == "aux"),
                 "--moe-top-k, --moe-every, --moe-shared, --moe-capacity and --moe-balance shape a mixture of "
                 "experts: they need --moe-experts");
    MINIDL_CHECK(moe.moe_experts == 0 || model == "llama", "--moe-experts ", moe.moe_experts,
                 ": a mixture of experts has SwiGLU experts; it needs --model llama");
    w.model.moe_experts = moe.moe_experts;
    w.model.moe_top_k = moe.moe_top_k;
    w.model.moe_every = moe.moe_every;
    w.model.moe_shared = moe.moe_shared;
    w.model.moe_capacity = moe.moe_capacity;
    w.model.moe_balance = moe_balance == "bias"   ? nn::GPTConfig::Balance::kBias
                          : moe_balance == "none" ? nn::GPTConfig::Balance::kNone
                                                  : nn::GPTConfig::Balance::kAux;
    w.model.validate();
    l.recompute = nn::parse_recompute(recompute);
    l.amp = amp == "bf16" ? DType::bf16 : amp == "fp16" ? DType::f16 : DType::f32;
    l.schedule = dist::parse_schedule_kind(schedule);
    l.sync = predict::parse_outer_sync(sync);
    l.ps_mode = predict::parse_ps_mode(ps_mode);
    if (do_plan) {
      MINIDL_CHECK(gpus > 0, "--plan needs --gpus N");
      MINIDL_CHECK(l.sync == predict::OuterSync::kNone && l.ps_servers == 0,
                   "--plan ranks the layouts of one synchronous group: not with --sync or --ps");
      const double budget = budget_gib > 0 ? budget_gib * double(1ull << 30) : m.mem_capacity;
      const auto rows = predict::plan(w, gpus, l.amp, m, budget, max_micro);
      std::fputs(json ? (predict::plan_json(rows, m) + "\n").c_str()
                      : predict::format_plan(rows, m, plan_top, plan_refused).c_str(),
                 stdout);
      return 0;
    }
    MINIDL_CHECK(gpus == 0 || gpus == l.gpus(), "--gpus ", gpus,
                 " but --dp x --cp x --tp x --pp (x --replica-groups, + --ps) = ", l.gpus());
    const predict::Prediction p = predict::predict(w, l, m);
    std::fputs(json ? (predict::prediction_json(p, m) + "\n").c_str() : predict::format_prediction(p, m).c_str(),
               stdout);
  } catch (const Error& e) {
    std::fprintf(stderr, "minidl_predict: error: %s\n", e.what());
    return 2;
  }
  return 0;
}
