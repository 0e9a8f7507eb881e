#include "predict/report.h"

#include <nlohmann/json.hpp>

#include <cctype>
#include <cstdio>
#include <map>

namespace minidl::predict {

namespace {

constexpr double kMiB = double(1 << 20), kMs = 1e3;

std::string line(const char* fmt, auto... args) {
  char text[512];
  std::snprintf(text, sizeof text, fmt, args...);
  return text;
}

std::string layout_text(const Prediction& p) {
  const Layout& l = p.layout;
  return describe(l) + " b " + std::to_string(p.micro_batch) + " " +
         (l.amp == DType::f32 ? std::string("f32") : std::string(dtype_name(l.amp)));
}

nlohmann::json to_json(const Prediction& p) {
  const StepTime& t = p.time;
  const Layout& l = p.layout;
  return {{"layout",
           {{"dp", l.dp},
            {"cp", l.cp},
            {"ep", l.ep},
            {"tp", l.tp},
            {"pp", l.pp},
            {"virtual_stages", l.virtual_stages},
            {"micro_batches", l.micro_batches},
            {"micro_batch", p.micro_batch},
            {"zero", l.zero},
            {"recompute", nn::recompute_name(l.recompute)},
            {"amp", l.amp == DType::f32 ? "f32" : dtype_name(l.amp)},
            {"sequence_parallel", l.sequence_parallel}}},
          {"step_ms", t.total() * kMs},
          {"breakdown_ms",
           {{"compute", t.compute * kMs},
            {"tp_comm", t.tp_comm * kMs},
            {"cp_comm", t.cp_comm * kMs},
            {"ep_comm", t.ep_comm * kMs},
            {"pp_comm", t.pp_comm * kMs},
            {"dp_comm_exposed", t.dp_comm * kMs},
            {"dp_comm_total", p.dp_comm_total * kMs},
            {"bubble", t.bubble * kMs},
            {"optimizer", t.optimizer * kMs},
            {"zero_copies", t.zero_copies * kMs},
            {"outer", t.outer * kMs}}},
          {"compute_by_class_ms",
           {{"gemm", p.compute_by_class.gemm * kMs},
            {"attention", p.compute_by_class.attention * kMs},
            {"elementwise", p.compute_by_class.elementwise * kMs}}},
          {"dp_collective", p.dp_collective},
          {"bubble_fraction", p.bubble_fraction},
          {"memory_mib",
           {{"params", (p.memory.params_rest + p.memory.params_step) / kMiB},
            {"grads", (p.memory.grads_rest + p.memory.grads_step) / kMiB},
            {"optimizer", p.memory.optimizer / kMiB},
            {"activations", p.activation_bytes / kMiB},
            {"activations_in_flight", p.activations_in_flight},
            {"peak", p.memory_peak / kMiB}}},
          {"fits", p.fits},
          {"tokens_per_s", p.tokens_per_s},
          {"mfu", p.mfu},
          {"single_gpu_step_ms", p.single_gpu_step * kMs},
          {"scaling_efficiency", p.efficiency}};
}

// A refusal's reason with its numbers as "N", so the reasons left unprinted are counted by kind.
std::string reason_kind(const std::string& reason) {
  std::string kind;
  for (char c : reason)
    if (!std::isdigit(static_cast<unsigned char>(c)) && c != '.')
      kind += c;
    else if (kind.empty() || kind.back() != 'N')
      kind += 'N';
  return kind;
}

}  // namespace

std::string format_prediction(const Prediction& p, const Machine& m) {
  const StepTime& t = p.time;
  const nn::GPTConfig& c = p.workload.model;
  std::string out;
  out += line("machine: %s, %d GPUs per node (%s)\n", m.name.c_str(), m.gpus_per_node, m.source.c_str());
  const std::string llama =
      (c.llama() ? line(" kv-heads %lld ffn %lld", (long long)c.kv_heads(), (long long)c.mlp_width()) : "") +
      (c.moe() ? line(" moe %lld experts top-%lld every %lld shared %lld", (long long)c.moe_experts,
                      (long long)c.moe_top_k, (long long)c.moe_every, (long long)c.moe_shared)
               : "");
  out +=
      line("model: %s layers %lld heads %lld%s embd %lld seq %lld vocab %lld; global batch %lld sequences\n",
           c.llama() ? "llama" : "gpt2", (long long)c.n_layer, (long long)c.n_head, llama.c_str(), (long long)c.n_embd,
           (long long)c.block_size, (long long)c.vocab_size, (long long)p.workload.global_batch);
  out += line("layout: %s (%d GPUs)\n", layout_text(p).c_str(), p.layout.gpus());
  out += line("\n%-44s %10s %7s\n", "step time", "ms", "share");
  const double total = t.total();
  auto row = [&](const char* name, double s) { out += line("%-44s %10.3f %6.1f%%\n", name, s * kMs, 100 * s / total); };
  row("compute (forward, backward)", t.compute);
  row("tp collectives", t.tp_comm);
  if (p.layout.cp > 1) row("cp ring sends (exposed)", t.cp_comm);
  if (p.layout.ep > 1) row("ep all-to-alls", t.ep_comm);
  row("pp send/recv (exposed)", t.pp_comm);
  const std::string dp = std::string("dp ") + (p.dp_collective[0] ? p.dp_collective : "-") + " (exposed)";
  row(dp.c_str(), t.dp_comm);
  row("pipeline bubble", t.bubble);
  row("optimizer", t.optimizer);
  row("ZeRO copies and zeroing", t.zero_copies);
  if (p.layout.sync != OuterSync::kNone) row("outer sync over the replicas (per step)", t.outer);
  if (p.layout.ps_servers > 0) row("parameter server push and pull", t.outer);
  out += line("%-44s %10.3f\n", "total", total * kMs);
  out += line("compute by op class: products %.3f ms, attention %.3f, memory-bound ops %.3f\n",
              p.compute_by_class.gemm * kMs, p.compute_by_class.attention * kMs, p.compute_by_class.elementwise * kMs);
  out += line("dp communication in all: %.3f ms (%.3f hidden behind backward); bubble fraction %.1f%%\n",
              p.dp_comm_total * kMs, (p.dp_comm_total - t.dp_comm) * kMs, 100 * p.bubble_fraction);
  out += line("\n%-44s %10s\n", "memory per GPU (busiest rank)", "MiB");
  out += line("%-44s %10.1f\n", "params", (p.memory.params_rest + p.memory.params_step) / kMiB);
  out += line("%-44s %10.1f\n", "grads", (p.memory.grads_rest + p.memory.grads_step) / kMiB);
  out += line("%-44s %10.1f\n", "optimizer", p.memory.optimizer / kMiB);
  out += line("%-44s %10.1f\n", ("activations (" + std::to_string(p.activations_in_flight) + " in flight)").c_str(),
              p.activation_bytes / kMiB);
  out += line("%-44s %10.1f  of %.1f: %s\n", "peak", p.memory_peak / kMiB, m.mem_capacity / kMiB,
              p.fits ? "fits" : "DOES NOT FIT");
  out += line("\ntokens/s %.0f   MFU %.1f%%   scaling efficiency %.1f%% (one GPU: %.3f ms per step)\n", p.tokens_per_s,
              100 * p.mfu, 100 * p.efficiency, p.single_gpu_step * kMs);
  return out;
}

std::string prediction_json(const Prediction& p, const Machine& m) {
  nlohmann::json j = to_json(p);
  j["machine"] = m.name;
  return j.dump();
}

std::string format_plan(const std::vector<PlanRow>& rows, const Machine& m, int top, int refused_lines) {
  std::string out = line("machine: %s\n%-4s %-46s %10s %8s %7s %6s %10s\n", m.name.c_str(), "rank", "layout", "step_ms",
                         "peak_MiB", "MFU", "eff", "tokens/s");
  int shown = 0, valid = 0, refused = 0;
  std::map<std::string, int> rest;
  for (const PlanRow& r : rows) {
    if (r.refused.empty()) {
      ++valid;
      if (shown++ < top) {
        const Prediction& p = r.prediction;
        out += line("%-4d %-56s %10.3f %8.1f %6.1f%% %5.1f%% %10.0f\n", valid, layout_text(p).c_str(),
                    p.time.total() * kMs, p.memory_peak / kMiB, 100 * p.mfu, 100 * p.efficiency, p.tokens_per_s);
      }
      continue;
    }
    if (refused == 0) out += line("\nrefused:\n");
    if (refused++ < refused_lines)
      out += line("  %-56s %s\n", describe(r.layout).c_str(), r.refused.c_str());
    else
      ++rest[reason_kind(r.refused)];
  }
  if (valid == 0) out += "no layout is valid\n";
  if (valid > top) out += line("(%d more valid layouts; --plan-top to see them)\n", valid - top);
  for (const auto& [reason, n] : rest) out += line("  ... %d more refused: %s\n", n, reason.c_str());
  return out;
}

std::string plan_json(const std::vector<PlanRow>& rows, const Machine& m) {
  nlohmann::json valid = nlohmann::json::array(), refused = nlohmann::json::array();
  for (const PlanRow& r : rows) {
    if (r.refused.empty())
      valid.push_back(to_json(r.prediction));
    else
      refused.push_back({{"layout", describe(r.layout)}, {"reason", r.refused}});
  }
  return nlohmann::json{{"machine", m.name}, {"valid", valid}, {"refused", refused}}.dump();
}

}  // namespace minidl::predict
