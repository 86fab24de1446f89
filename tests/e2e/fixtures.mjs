// Small files the specs make on the fly (nothing binary is committed).
import fs from 'node:fs';
import path from 'node:path';

/** Serialises f32 tensors `{name: [shape, Float32Array]}` as safetensors. */
export function safetensors(tensors) {
  const header = { __metadata__: { format: 'pt' } };
  let off = 0;
  for (const [name, [shape, data]] of Object.entries(tensors)) {
    header[name] = { dtype: 'F32', shape, data_offsets: [off, off + data.byteLength] };
    off += data.byteLength;
  }
  let h = Buffer.from(JSON.stringify(header));
  const pad = (8 - (h.length % 8)) % 8;
  h = Buffer.concat([h, Buffer.alloc(pad, 0x20)]);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(h.length));
  return Buffer.concat([len, h, ...Object.values(tensors).map(([, d]) => Buffer.from(d.buffer))]);
}

/** A tiny random Llama (1 layer, d=8, vocab 32): a model that matches nothing. */
export function tinyLlama(dir) {
  fs.mkdirSync(dir, { recursive: true });
  const cfg = { model_type: 'llama', vocab_size: 32, hidden_size: 8, intermediate_size: 16, num_hidden_layers: 1,
    num_attention_heads: 2, num_key_value_heads: 2, tie_word_embeddings: true, max_position_embeddings: 64 };
  const r = (n) => Float32Array.from({ length: n }, (_, i) => Math.sin(i * 0.37) * 0.1);
  const t = {
    'model.embed_tokens.weight': [[32, 8], r(256)],
    'model.layers.0.input_layernorm.weight': [[8], r(8)],
    'model.layers.0.self_attn.q_proj.weight': [[8, 8], r(64)],
    'model.layers.0.self_attn.k_proj.weight': [[8, 8], r(64)],
    'model.layers.0.self_attn.v_proj.weight': [[8, 8], r(64)],
    'model.layers.0.self_attn.o_proj.weight': [[8, 8], r(64)],
    'model.layers.0.post_attention_layernorm.weight': [[8], r(8)],
    'model.layers.0.mlp.gate_proj.weight': [[16, 8], r(128)],
    'model.layers.0.mlp.up_proj.weight': [[16, 8], r(128)],
    'model.layers.0.mlp.down_proj.weight': [[8, 16], r(128)],
    'model.norm.weight': [[8], r(8)],
  };
  fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify(cfg));
  fs.writeFileSync(path.join(dir, 'model.safetensors'), safetensors(t));
  return [path.join(dir, 'model.safetensors'), path.join(dir, 'config.json')];
}

/** config.json of a 70B Llama beside a dummy weights file (too large for a tab). */
export function hugeConfig(dir) {
  fs.mkdirSync(dir, { recursive: true });
  const cfg = { model_type: 'llama', vocab_size: 128256, hidden_size: 8192, intermediate_size: 28672,
    num_hidden_layers: 80, num_attention_heads: 64, num_key_value_heads: 8 };
  fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify(cfg));
  fs.writeFileSync(path.join(dir, 'model.safetensors'), safetensors({ x: [[1], new Float32Array([0])] }));
  return [path.join(dir, 'model.safetensors'), path.join(dir, 'config.json')];
}
