#include "runtime/step_codec.h"

#include <cstring>

#include "core/error.h"

namespace glms::runtime {

void ByteReader::take(void* out, size_t size) {
  GLMS_CHECK(at_ + size <= bytes_.size(), "a control message ended early");
  if (size > 0) std::memcpy(out, bytes_.data() + at_, size);
  at_ += size;
}

namespace {

// A step's row outputs, each with its token mask when it has one.
void write_outputs(ByteWriter& out, const std::vector<model::RowOutput>& outputs) {
  out.put<uint64_t>(outputs.size());
  for (const model::RowOutput& o : outputs) {
    out.put(o.kind);
    out.put(o.temperature);
    out.put(o.top_k);
    out.put(o.top_p);
    out.put(o.min_p);
    out.put(o.canonical);
    const auto mask = o.resolved_mask();  // a mask made on demand is made here, before it travels
    out.put<uint8_t>(mask != nullptr);
    if (mask) out.put_vector(*mask);
  }
}

std::vector<model::RowOutput> read_outputs(ByteReader& in) {
  std::vector<model::RowOutput> outputs(in.get<uint64_t>());
  for (model::RowOutput& o : outputs) {
    o.kind = in.get<model::RowOutput::Kind>();
    o.temperature = in.get<float>();
    o.top_k = in.get<int>();
    o.top_p = in.get<float>();
    o.min_p = in.get<float>();
    o.canonical = in.get<double>();
    if (in.get<uint8_t>()) o.mask = std::make_shared<const std::vector<uint32_t>>(in.get_vector<uint32_t>());
  }
  return outputs;
}

}  // namespace

void write_steps(ByteWriter& out, const std::vector<RankStep>& steps, int64_t hidden) {
  out.put<uint32_t>(static_cast<uint32_t>(steps.size()));
  for (const RankStep& step : steps) {
    const model::ForwardBatch& b = step.batch;
    out.put_vector(b.token_ids);
    out.put_vector(b.positions);
    out.put_vector(b.slot_mapping);
    out.put_vector(b.token_sequence);
    out.put_vector(b.logits_tokens);
    out.put_vector(b.dp_peers);
    out.put<uint32_t>(static_cast<uint32_t>(b.sequences.size()));
    for (const model::SequenceSlice& s : b.sequences) {
      out.put(s.first_token);
      out.put(s.num_tokens);
      out.put(s.context_len);
      out.put_vector(s.block_table);
    }
    write_outputs(out, step.outputs);
    out.put<uint8_t>(step.h_prev != nullptr);
    if (step.h_prev)
      out.put_vector(std::vector<float>(step.h_prev, step.h_prev + int64_t{b.num_tokens()} * hidden));
  }
}

std::vector<RankStep> read_steps(ByteReader& in, int64_t hidden, std::vector<std::vector<float>>& h_prev_rows) {
  std::vector<RankStep> steps(in.get<uint32_t>());
  h_prev_rows.assign(steps.size(), {});
  for (size_t r = 0; r < steps.size(); ++r) {
    model::ForwardBatch& b = steps[r].batch;
    b.token_ids = in.get_vector<int32_t>();
    b.positions = in.get_vector<int32_t>();
    b.slot_mapping = in.get_vector<int64_t>();
    b.token_sequence = in.get_vector<int32_t>();
    b.logits_tokens = in.get_vector<int32_t>();
    b.dp_peers = in.get_vector<model::DpStepShape>();
    b.sequences.resize(in.get<uint32_t>());
    for (model::SequenceSlice& s : b.sequences) {
      s.first_token = in.get<int>();
      s.num_tokens = in.get<int>();
      s.context_len = in.get<int>();
      s.block_table = in.get_vector<int32_t>();
    }
    steps[r].outputs = read_outputs(in);
    if (in.get<uint8_t>()) {
      h_prev_rows[r] = in.get_vector<float>();
      GLMS_CHECK(static_cast<int64_t>(h_prev_rows[r].size()) == int64_t{b.num_tokens()} * hidden,
                 "a control message's MTP inputs do not match its tokens");
      steps[r].h_prev = h_prev_rows[r].data();
    }
  }
  return steps;
}

void write_result(ByteWriter& out, const RankResult& result) {
  out.put(result.logits.vocab_size);
  out.put_vector(result.logits.token);
  out.put_vector(result.logits.full_row);
  out.put_vector(result.logits.full);
  out.put_vector(result.hidden);
}

RankResult read_result(ByteReader& in) {
  RankResult result;
  result.logits.vocab_size = in.get<int>();
  result.logits.token = in.get_vector<int32_t>();
  result.logits.full_row = in.get_vector<int32_t>();
  result.logits.full = in.get_vector<float>();
  result.hidden = in.get_vector<float>();
  return result;
}

void write_cache_shape(ByteWriter& out, const model::CacheShape& shape) { out.put(shape); }

model::CacheShape read_cache_shape(ByteReader& in) { return in.get<model::CacheShape>(); }

}  // namespace glms::runtime
