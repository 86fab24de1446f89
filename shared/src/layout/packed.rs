//! Packed expert tensors: transformers v5's own MoE layout, read and
//! written beside the per-expert one.
//!
//! An MoE layer's routed experts are stored either **per expert** (one
//! `[f, d]` / `[d, f]` matrix per expert and projection: Mixtral's
//! `experts.{e}.{w1,w3,w2}.weight`, Qwen's
//! `experts.{e}.{gate,up,down}_proj.weight`; what transformers 4.x,
//! `save_pretrained`, llama.cpp's converter, vLLM and candle read) or
//! **packed** (one tensor per projection pair for all `E` experts):
//!
//! - `{prefix}.experts.gate_up_proj [E, 2·f, d]`: row block `[0, f)` of
//!   expert `e` is its gate projection (`w1` / `gate_proj`), rows `[f, 2f)`
//!   its up projection (`w3` / `up_proj`);
//! - `{prefix}.experts.down_proj [E, d, f]`: expert `e`'s down projection
//!   (`w2` / `down_proj`), as it is;
//!
//! with no `.weight` suffix, where `{prefix}` is `model.layers.{l}.mlp` (the
//! router beside them is `{prefix}.gate.weight [E, d]`).
//!
//! Source, read in transformers 5.24.0 (the version of
//! `tests/reference/requirements.txt`):
//! - `transformers/conversion_mapping.py`, `_checkpoint_conversion_mapping`
//!   entries `"mixtral"` (a `WeightRenaming(".block_sparse_moe.", ".mlp.")`,
//!   then `WeightConverter([".experts.*.w1.weight", ".experts.*.w3.weight"] ->
//!   ".experts.gate_up_proj", [MergeModulelist(dim=0), Concatenate(dim=1)])`
//!   and `[".experts.*.w2.weight"] -> ".experts.down_proj",
//!   [MergeModulelist(dim=0)]`) and `"qwen2_moe"` (the same with
//!   `mlp.experts.*.{gate,up,down}_proj.weight`; `qwen3_moe` maps to it):
//!   `MergeModulelist(dim=0)` stacks the experts' `[f, d]` matrices into
//!   `[E, f, d]` (`core_model_loading.py`, `torch.stack(tensors, dim=0)`),
//!   `Concatenate(dim=1)` joins gate and up in that order along the rows
//!   (`torch.cat(..., dim=1)`): `[E, 2f, d]`, gate first;
//! - `models/mixtral/modeling_mixtral.py` `MixtralExperts` (and
//!   `Qwen3MoeExperts`, `Qwen2MoeExperts`, the same code):
//!   `gate_up_proj = nn.Parameter(torch.empty(E, 2 * intermediate, hidden))`,
//!   `down_proj = nn.Parameter(torch.empty(E, hidden, intermediate))`, and the
//!   forward `gate, up = linear(x, gate_up_proj[e]).chunk(2, dim=-1)`,
//!   `linear(act(gate) * up, down_proj[e])`: PyTorch's `[out, in]`
//!   orientation, gate the first half;
//! - `modeling_utils.py` `save_pretrained(save_original_format=True)`
//!   reverts to per-expert tensors by default; `save_original_format=False`
//!   writes the packed names above (how `tests/reference/make_packed_golden.py`
//!   makes the packed Qwen3-MoE fixture);
//! - mergekit 0.1.5 `mergekit/moe/mixtral.py` and `qwen3.py` write the
//!   packed form through transformers' own mapping
//!   (`mergekit/architecture/conversion.py` `convert_checkpoint_tensors`),
//!   under `model.layers.{l}.mlp.` for Mixtral too, router
//!   `model.layers.{l}.mlp.gate.weight`.
//!
//! transformers 5 loads Mixtral's packed tensors under either prefix
//! (`block_sparse_moe.` is renamed to `mlp.` first), so the Mixtral layout
//! reads both and writes `mlp.` (router included), as transformers and
//! mergekit do. The studio layout, which keeps the canonical names, packs
//! under `model.layers.{l}.block_sparse_moe` (per layer: its expert count
//! and width may differ between layers). Shared experts are never packed.
//!
//! **Reading** ([`PackedSource`]): each packed tensor is shown as the
//! layout's per-expert tensors, each a slice of the packed tensor's bytes
//! read on demand ([`TensorSource::read_f32_range`]), so nothing is copied
//! ahead and no second copy of the model exists. A layer with neither form
//! is refused naming both; a packed tensor whose expert dimension (or
//! width) disagrees with `config.json` is refused naming the tensor.
//!
//! **Writing** ([`Packing`], [`PackingSink`], `--experts-format packed`):
//! the methods stream per-expert tensors as always; a sink between them and
//! the file writer gathers one layer's routed experts (the memory of one MoE
//! layer's experts, in the output dtype) and writes its two packed tensors
//! when the layer's last expert tensor arrives. The browser tab writes per
//! expert (it writes its output in runs between yields).

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use super::names::{Proj, TensorRole};
use super::MoeLayout;
use crate::config::{ModelConfig, MoeConfig};
use crate::error::{Result, StudioError};
use crate::tensor_io::dtype::{f32_to_bytes, floats_to_f32};
use crate::tensor_io::sink::TensorSink;
use crate::tensor_io::{DType, PlannedTensor, TensorInfo, TensorSource};

/// How an MoE's routed experts are stored (`--experts-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExpertsFormat {
    /// One tensor per expert and projection (transformers 4.x,
    /// `save_pretrained`, llama.cpp, vLLM, candle): the default.
    #[default]
    PerExpert,
    /// `experts.gate_up_proj [E, 2f, d]` + `experts.down_proj [E, d, f]` per
    /// layer (transformers 5's model layout, mergekit-moe 0.1.5).
    Packed,
}

impl ExpertsFormat {
    /// The command-line name (`per-expert`, `packed`).
    pub fn name(self) -> &'static str {
        match self {
            ExpertsFormat::PerExpert => "per-expert",
            ExpertsFormat::Packed => "packed",
        }
    }

    /// Parses `--experts-format`.
    ///
    /// # Errors
    /// [`StudioError::Config`] (source `--experts-format`) naming the two
    /// values.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "per-expert" | "per_expert" => Ok(ExpertsFormat::PerExpert),
            "packed" => Ok(ExpertsFormat::Packed),
            _ => Err(StudioError::config(
                "--experts-format",
                format!("unknown format `{s}` (expected per-expert or packed)"),
            )),
        }
    }
}

/// The packed gate-up tensor under the module prefix `prefix`
/// (`model.layers.{l}.mlp`): `{prefix}.experts.gate_up_proj`.
pub fn gate_up_name(prefix: &str) -> String {
    format!("{prefix}.experts.gate_up_proj")
}

/// The packed down tensor under `prefix`: `{prefix}.experts.down_proj`.
pub fn down_name(prefix: &str) -> String {
    format!("{prefix}.experts.down_proj")
}

/// One MoE layer whose routed experts are packed in a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedLayer {
    /// Decoder layer.
    pub layer: usize,
    /// `{prefix}.experts.gate_up_proj` `[E, 2f, d]`.
    pub gate_up: TensorInfo,
    /// `{prefix}.experts.down_proj` `[E, d, f]`.
    pub down: TensorInfo,
    /// Experts `E`.
    pub experts: usize,
    /// Expert width `f`.
    pub width: usize,
    /// Hidden size `d`.
    pub hidden: usize,
}

impl PackedLayer {
    /// Where expert `e`'s projection `proj` lies in the packed tensors: the
    /// packed tensor and the flat element range (gate: rows `[0, f)` of
    /// `gate_up_proj[e]`, up: rows `[f, 2f)`, down: `down_proj[e]`).
    pub fn slice(&self, e: usize, proj: Proj) -> (&TensorInfo, Range<usize>) {
        let m = self.width * self.hidden;
        match proj {
            Proj::Gate => (&self.gate_up, 2 * e * m..2 * e * m + m),
            Proj::Up => (&self.gate_up, 2 * e * m + m..2 * (e + 1) * m),
            Proj::Down => (&self.down, e * m..(e + 1) * m),
        }
    }
}

/// Describes the per-expert tensor names of `layout` in layer `l`, for
/// errors.
fn per_expert_pattern(layout: &dyn MoeLayout, l: usize) -> String {
    let name = |proj| layout.disk_name(&TensorRole::Expert { layer: l, expert: 0, proj });
    let gate = name(Proj::Gate).replacen(".experts.0.", ".experts.{e}.", 1);
    let tail = |p| name(p).rsplit('.').nth(1).unwrap_or("").to_string();
    format!("`{gate}` (and `{}`, `{}`)", tail(Proj::Up), tail(Proj::Down))
}

/// Finds, for every MoE layer of `moe`, how `src` (on-disk names of
/// `layout`) stores its routed experts: the packed layers (empty when every
/// layer is per-expert).
///
/// # Errors
/// [`StudioError::Config`] naming the layer when it has neither form (both
/// named, with the shapes the configuration implies) or both;
/// [`StudioError::Tensor`] naming a packed tensor without its partner, or
/// one whose shape disagrees with the configuration (its expert dimension
/// against `num_experts`, its width, its hidden size).
pub fn find_packed(
    src: &dyn TensorSource,
    layout: &dyn MoeLayout,
    base: &ModelConfig,
    moe: &MoeConfig,
) -> Result<Vec<PackedLayer>> {
    let mut per_expert: HashSet<usize> = HashSet::new();
    for t in src.tensors() {
        if let TensorRole::Expert { layer, .. } = layout.role_of(&t.name) {
            per_expert.insert(layer);
        }
    }
    let d = base.hidden_size;
    let mut out = Vec::new();
    for (l, spec) in moe.layers.iter().enumerate() {
        let Some(spec) = spec else { continue };
        let (e, f) = (spec.num_experts, spec.expert_width(base));
        let prefixes = layout.packed_prefixes(l);
        let found = prefixes.iter().find_map(|p| {
            let (gu, dn) = (src.info(&gate_up_name(p)), src.info(&down_name(p)));
            (gu.is_some() || dn.is_some()).then(|| (p.clone(), gu, dn))
        });
        let looked = || {
            let packed: Vec<String> = prefixes
                .iter()
                .map(|p| format!("`{}` [{e}, {}, {d}] + `{}` [{e}, {d}, {f}]", gate_up_name(p), 2 * f, down_name(p)))
                .collect();
            format!(
                "per-expert tensors {} for e < {e}; packed tensors {} (transformers 5, mergekit-moe 0.1.5)",
                per_expert_pattern(layout, l),
                packed.join(" or ")
            )
        };
        let (prefix, gu, dn) = match (per_expert.contains(&l), found) {
            (true, None) => continue,
            (false, None) => {
                return Err(StudioError::config(
                    src.source_name(),
                    format!(
                    "layer {l} is an MoE layer of the {} layout ({e} experts) but the checkpoint has its experts in \
                         neither expert layout; looked for {}",
                    layout.name(),
                    looked()
                ),
                ))
            }
            (true, Some((p, _, _))) => {
                return Err(StudioError::config(
                    src.source_name(),
                    format!(
                        "layer {l} has both per-expert tensors and packed ones (`{}`): one layout per layer, please",
                        gate_up_name(&p)
                    ),
                ))
            }
            (false, Some(x)) => x,
        };
        let (gu_name, dn_name) = (gate_up_name(&prefix), down_name(&prefix));
        let missing = |name: &str, other: &str| {
            StudioError::tensor(
                src.source_name(),
                name,
                format!("missing: `{other}` is there, and a packed layer needs both"),
            )
        };
        let gu = gu.ok_or_else(|| missing(&gu_name, &dn_name))?;
        let dn = dn.ok_or_else(|| missing(&dn_name, &gu_name))?;
        for (t, want, what) in [
            (&gu, [e, 2 * f, d], "[experts, 2 · expert width (gate rows, then up rows), hidden]"),
            (&dn, [e, d, f], "[experts, hidden, expert width]"),
        ] {
            if t.shape.len() != 3 {
                return Err(StudioError::tensor(
                    src.source_name(),
                    &t.name,
                    format!("shape {:?} is not 3-D: a packed expert tensor is {what} = {want:?}", t.shape),
                ));
            }
            if t.shape[0] != e {
                return Err(StudioError::tensor(
                    src.source_name(),
                    &t.name,
                    format!(
                        "expert dimension {} disagrees with config.json, which gives layer {l} {e} experts \
                         (shape {:?}, expected {want:?} = {what})",
                        t.shape[0], t.shape
                    ),
                ));
            }
            if t.shape[..] != want[..] {
                return Err(StudioError::tensor(
                    src.source_name(),
                    &t.name,
                    format!(
                        "shape {:?} disagrees with config.json: expected {want:?} = {what} (expert width {f}, hidden \
                         size {d})",
                        t.shape
                    ),
                ));
            }
            if t.dtype.float_size().is_none() {
                return Err(StudioError::UnsupportedDType {
                    file: src.source_name().to_string(),
                    tensor: t.name.clone(),
                    dtype: t.dtype.to_string(),
                    hint: "packed expert tensors must be F32, F16 or BF16".into(),
                });
            }
        }
        out.push(PackedLayer { layer: l, gate_up: gu, down: dn, experts: e, width: f, hidden: d });
    }
    Ok(out)
}

/// A checkpoint with packed experts seen per expert: every packed
/// tensor is replaced by the layout's per-expert tensors
/// ([`MoeLayout::disk_name`] of each [`TensorRole::Expert`]), each read as a
/// slice of the packed tensor's bytes.
pub struct PackedSource {
    inner: Box<dyn TensorSource + Send + Sync>,
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
    /// Shown name -> (packed tensor, element range).
    parts: HashMap<String, (String, Range<usize>)>,
    /// The packed tensors (hidden).
    packed: HashSet<String>,
}

impl PackedSource {
    /// Shows the packed layers `layers` ([`find_packed`]) of `inner` as the
    /// per-expert tensors of `layout`, in the packed tensors' places (gate
    /// and up of each expert where `gate_up_proj` was, down where
    /// `down_proj` was).
    pub fn new(inner: Box<dyn TensorSource + Send + Sync>, layout: &dyn MoeLayout, layers: &[PackedLayer]) -> Self {
        let mut by_name: HashMap<&str, (&PackedLayer, &[Proj])> = HashMap::new();
        for p in layers {
            by_name.insert(&p.gate_up.name, (p, &[Proj::Gate, Proj::Up]));
            by_name.insert(&p.down.name, (p, &[Proj::Down]));
        }
        let mut tensors = Vec::new();
        let mut parts = HashMap::new();
        let mut packed = HashSet::new();
        for t in inner.tensors() {
            let Some((p, projs)) = by_name.get(t.name.as_str()) else {
                tensors.push(t);
                continue;
            };
            packed.insert(t.name.clone());
            for e in 0..p.experts {
                for &proj in projs.iter() {
                    let name = layout.disk_name(&TensorRole::Expert { layer: p.layer, expert: e, proj });
                    let (_, range) = p.slice(e, proj);
                    tensors.push(TensorInfo {
                        name: name.clone(),
                        dtype: t.dtype,
                        shape: proj.shape(p.hidden, p.width),
                    });
                    parts.insert(name, (t.name.clone(), range));
                }
            }
        }
        let index = tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        PackedSource { inner, tensors, index, parts, packed }
    }
}

impl TensorSource for PackedSource {
    fn source_name(&self) -> &str {
        self.inner.source_name()
    }

    fn tensors(&self) -> Vec<TensorInfo> {
        self.tensors.clone()
    }

    fn info(&self, name: &str) -> Option<TensorInfo> {
        self.index.get(name).map(|&i| self.tensors[i].clone())
    }

    fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        match self.parts.get(name) {
            Some((packed, range)) => self.inner.read_f32_range(packed, range.clone()),
            None if self.packed.contains(name) => {
                Err(StudioError::tensor(self.source_name(), name, "a packed tensor: read its experts one by one"))
            }
            None => self.inner.read_f32(name),
        }
    }

    fn read_f32_range(&self, name: &str, range: Range<usize>) -> Result<Vec<f32>> {
        match self.parts.get(name) {
            Some((packed, r)) if range.end <= r.len() => {
                self.inner.read_f32_range(packed, r.start + range.start..r.start + range.end)
            }
            Some(_) => Err(StudioError::tensor(self.source_name(), name, format!("elements {range:?} out of range"))),
            None => self.inner.read_f32_range(name, range),
        }
    }
}

// ---------------------------------------------------------------------------
// Writing.
// ---------------------------------------------------------------------------

/// One packed output tensor being gathered.
#[derive(Debug)]
struct Slot {
    name: String,
    dtype: DType,
    numel: usize,
    buf: Vec<u8>,
}

/// Where a per-expert tensor goes: its slot, element offset, and its own
/// dtype (converted to the slot's if they differ).
#[derive(Debug, Clone)]
struct Piece {
    slot: usize,
    offset: usize,
    dtype: DType,
    /// The layer group the slot belongs to.
    group: usize,
}

/// The packing of a per-expert write plan (`--experts-format packed`): the
/// file plan ([`Packing::file_plan`]) and the state of the sink that turns
/// per-expert writes into packed ones ([`Packing::write`]).
#[derive(Debug)]
pub struct Packing {
    file_plan: Vec<PlannedTensor>,
    pieces: HashMap<String, Piece>,
    renames: HashMap<String, String>,
    slots: Vec<Slot>,
    /// Per layer group: its two slots and the pieces still to come.
    groups: Vec<(usize, usize, usize)>,
}

impl Packing {
    /// Packs `planned` (a per-expert plan under `layout`'s on-disk names,
    /// as [`super::LayoutChoice::disk_plan`] makes): each MoE layer's routed
    /// expert tensors become `gate_up_proj [E, 2f, d]` and `down_proj [E, d,
    /// f]` under the layout's first [`MoeLayout::packed_prefixes`], in the
    /// place of the layer's last expert tensor, each in the dtype of the
    /// layer's first gate (resp. down) projection; a router whose name
    /// differs under that prefix (Mixtral: `block_sparse_moe.gate.weight` ->
    /// `mlp.gate.weight`) is renamed. Other tensors are unchanged.
    ///
    /// # Errors
    /// [`StudioError::Invalid`] when a layer's expert tensors do not form
    /// `E` complete experts of one width (not a plan the methods make).
    pub fn new(layout: &dyn MoeLayout, planned: &[PlannedTensor]) -> Result<Self> {
        #[derive(Default)]
        struct Layer {
            last: usize,
            tensors: Vec<(usize, usize, Proj)>,
        }
        let mut layers: std::collections::BTreeMap<usize, Layer> = Default::default();
        for (i, p) in planned.iter().enumerate() {
            if let TensorRole::Expert { layer, expert, proj } = layout.role_of(&p.name) {
                let entry = layers.entry(layer).or_default();
                entry.last = i;
                entry.tensors.push((i, expert, proj));
            }
        }
        let bad = |l: usize, why: String| StudioError::Invalid(format!("cannot pack layer {l}'s experts: {why}"));
        let mut pieces = HashMap::new();
        let mut slots = Vec::new();
        let mut groups = Vec::new();
        let mut at_last: HashMap<usize, [PlannedTensor; 2]> = HashMap::new();
        for (&l, layer) in &layers {
            let e = layer.tensors.iter().map(|t| t.1).max().unwrap_or(0) + 1;
            if layer.tensors.len() != 3 * e {
                return Err(bad(l, format!("{} expert tensors for {e} experts", layer.tensors.len())));
            }
            let first = |proj: Proj| layer.tensors.iter().find(|t| t.2 == proj).map(|t| &planned[t.0]);
            let (Some(g), Some(dn)) = (first(Proj::Gate), first(Proj::Down)) else {
                return Err(bad(l, "no gate or down projection".into()));
            };
            let (f, d) = (g.shape[0], g.shape[1]);
            let prefix = layout
                .packed_prefixes(l)
                .into_iter()
                .next()
                .ok_or_else(|| bad(l, "the layout has no packed form".into()))?;
            let group = groups.len();
            let (gu_slot, dn_slot) = (slots.len(), slots.len() + 1);
            let gu = PlannedTensor { name: gate_up_name(&prefix), dtype: g.dtype, shape: vec![e, 2 * f, d] };
            let down = PlannedTensor { name: down_name(&prefix), dtype: dn.dtype, shape: vec![e, d, f] };
            for p in [&gu, &down] {
                slots.push(Slot {
                    name: p.name.clone(),
                    dtype: p.dtype,
                    numel: p.shape.iter().product(),
                    buf: Vec::new(),
                });
            }
            let m = f * d;
            let mut seen = HashSet::new();
            for &(i, expert, proj) in &layer.tensors {
                let p = &planned[i];
                if p.shape != proj.shape(d, f) || !seen.insert((expert, proj)) {
                    return Err(bad(
                        l,
                        format!("`{}` has shape {:?} or repeats (expected {:?})", p.name, p.shape, proj.shape(d, f)),
                    ));
                }
                let (slot, offset) = match proj {
                    Proj::Gate => (gu_slot, 2 * expert * m),
                    Proj::Up => (gu_slot, 2 * expert * m + m),
                    Proj::Down => (dn_slot, expert * m),
                };
                pieces.insert(p.name.clone(), Piece { slot, offset, dtype: p.dtype, group });
            }
            groups.push((gu_slot, dn_slot, 3 * e));
            at_last.insert(layer.last, [gu, down]);
        }
        let mut renames = HashMap::new();
        let mut file_plan = Vec::with_capacity(planned.len());
        for (i, p) in planned.iter().enumerate() {
            if let Some(packed) = at_last.remove(&i) {
                file_plan.extend(packed);
                continue;
            }
            if pieces.contains_key(&p.name) {
                continue;
            }
            let name = match layout.role_of(&p.name) {
                TensorRole::Router { layer } if layers.contains_key(&layer) => {
                    let prefix = layout.packed_prefixes(layer).into_iter().next().unwrap_or_default();
                    format!("{prefix}.gate.weight")
                }
                _ => p.name.clone(),
            };
            if name != p.name {
                renames.insert(p.name.clone(), name.clone());
            }
            file_plan.push(PlannedTensor { name, ..p.clone() });
        }
        Ok(Packing { file_plan, pieces, renames, slots, groups })
    }

    /// The tensors as they are written to the file.
    pub fn file_plan(&self) -> &[PlannedTensor] {
        &self.file_plan
    }

    /// Takes the next per-expert-plan tensor `name` (bytes in its planned
    /// dtype) and writes into `inner` what is complete: an expert tensor is
    /// gathered until its layer's last one arrives, then the layer's
    /// `gate_up_proj` and `down_proj` are written; a renamed tensor goes
    /// under its new name; anything else passes through.
    ///
    /// # Errors
    /// Those of `inner`; [`StudioError::Invalid`] for a byte count that
    /// does not fit the piece.
    pub fn write(&mut self, inner: &mut dyn TensorSink, name: &str, data: &[u8]) -> Result<()> {
        let Some(piece) = self.pieces.get(name).cloned() else {
            return match self.renames.get(name) {
                Some(n) => inner.write_tensor(n, data),
                None => inner.write_tensor(name, data),
            };
        };
        let slot = &mut self.slots[piece.slot];
        let size = slot.dtype.float_size().unwrap_or(4);
        let converted;
        let bytes = if piece.dtype == slot.dtype {
            data
        } else {
            let v = floats_to_f32(piece.dtype, data)
                .ok_or_else(|| StudioError::Invalid(format!("tensor `{name}`: cannot pack dtype {}", piece.dtype)))?;
            converted = f32_to_bytes(slot.dtype, &v, "the output", name)?;
            &converted
        };
        if slot.buf.is_empty() {
            slot.buf = vec![0u8; slot.numel * size];
        }
        let start = piece.offset * size;
        let Some(dst) = slot.buf.get_mut(start..start + bytes.len()) else {
            return Err(StudioError::Invalid(format!(
                "tensor `{name}`: {} bytes do not fit `{}`",
                bytes.len(),
                slot.name
            )));
        };
        dst.copy_from_slice(bytes);
        let group = &mut self.groups[piece.group];
        group.2 -= 1;
        if group.2 == 0 {
            let (gu, dn) = (group.0, group.1);
            for s in [gu, dn] {
                let buf = std::mem::take(&mut self.slots[s].buf);
                inner.write_tensor(&self.slots[s].name, &buf)?;
            }
        }
        Ok(())
    }
}

/// A sink that packs per-expert writes ([`Packing::write`]) into `inner`,
/// or passes everything through (no packing: per-expert output).
pub struct PackingSink<'a> {
    inner: &'a mut dyn TensorSink,
    packing: Option<Packing>,
}

impl<'a> PackingSink<'a> {
    /// Wraps `inner` (created with the packing's [`Packing::file_plan`]).
    pub fn new(inner: &'a mut dyn TensorSink, packing: Option<Packing>) -> Self {
        PackingSink { inner, packing }
    }
}

impl TensorSink for PackingSink<'_> {
    fn write_tensor(&mut self, name: &str, data: &[u8]) -> Result<()> {
        match self.packing.as_mut() {
            Some(p) => p.write(self.inner, name, data),
            None => self.inner.write_tensor(name, data),
        }
    }
}

/// The canonical view's first step for a checkpoint of `layout`: `inner`
/// itself when every MoE layer of `moe` stores its experts per expert, else
/// a [`PackedSource`] showing the packed layers per expert. Also returns
/// which format it found (packed when any layer is).
///
/// # Errors
/// Those of [`find_packed`].
pub fn unpack_source(
    inner: Box<dyn TensorSource + Send + Sync>,
    layout: &dyn MoeLayout,
    base: &ModelConfig,
    moe: &MoeConfig,
) -> Result<(Box<dyn TensorSource + Send + Sync>, ExpertsFormat)> {
    let layers = find_packed(inner.as_ref(), layout, base, moe)?;
    if layers.is_empty() {
        return Ok((inner, ExpertsFormat::PerExpert));
    }
    Ok((Box::new(PackedSource::new(inner, layout, &layers)), ExpertsFormat::Packed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::names::{expert_weight_name, router_weight_name, shared_expert_weight_name};
    use crate::layout::studio::Studio;
    use crate::tensor_io::safetensors_io::SafetensorsFile;
    use crate::tensor_io::sink::{to_bytes, MemorySink};
    use crate::tensor_io::Bytes;

    /// Two experts of width 2 on d = 3, gate in f32 and up in bf16 (mixed:
    /// converted to the gate's dtype), a shared expert between them.
    fn plan() -> Vec<PlannedTensor> {
        let t = |name: String, dtype, shape: Vec<usize>| PlannedTensor { name, dtype, shape };
        let mut p = vec![t(router_weight_name(0), DType::F32, vec![2, 3])];
        for (proj, dtype) in [(Proj::Gate, DType::F32), (Proj::Up, DType::BF16), (Proj::Down, DType::F32)] {
            for e in 0..2 {
                p.push(t(expert_weight_name(0, e, proj), dtype, proj.shape(3, 2)));
            }
            p.push(t(shared_expert_weight_name(0, 0, proj), DType::F32, proj.shape(3, 4)));
        }
        p
    }

    /// Distinct values per tensor, exact in bf16.
    fn values(i: usize, n: usize) -> Vec<f32> {
        (0..n).map(|k| (i * 16 + k) as f32).collect()
    }

    #[test]
    fn packing_gathers_a_layer_and_the_packed_view_gives_each_expert_back() {
        let planned = plan();
        let mut packing = Packing::new(&Studio, &planned).unwrap();
        let names: Vec<&str> = packing.file_plan().iter().map(|p| p.name.as_str()).collect();
        let p = "model.layers.0.block_sparse_moe";
        assert_eq!(
            names,
            [
                format!("{p}.gate.weight"),
                format!("{p}.shared_experts.0.w1.weight"),
                format!("{p}.shared_experts.0.w3.weight"),
                format!("{p}.experts.gate_up_proj"),
                format!("{p}.experts.down_proj"),
                format!("{p}.shared_experts.0.w2.weight"),
            ]
        );
        assert_eq!(packing.file_plan()[3].shape, vec![2, 4, 3]);
        assert_eq!((packing.file_plan()[3].dtype, packing.file_plan()[4].shape.clone()), (DType::F32, vec![2, 3, 2]));
        let mut sink = MemorySink::new(packing.file_plan().to_vec());
        for (i, t) in planned.iter().enumerate() {
            let bytes = to_bytes(t.dtype, &values(i, t.shape.iter().product()), &t.name).unwrap();
            packing.write(&mut sink, &t.name, &bytes).unwrap();
        }
        let file = SafetensorsFile::parse(Bytes::from_vec(sink.into_safetensors().unwrap()), "mem").unwrap();
        // gate_up_proj[e] = [gate_e; up_e]: expert 1's up rows are the last 6 values
        let gu = file.read_f32(&format!("{p}.experts.gate_up_proj")).unwrap();
        let up1 = planned.iter().position(|t| t.name == expert_weight_name(0, 1, Proj::Up)).unwrap();
        assert_eq!(gu[18..], values(up1, 6)[..]);
        let layer = PackedLayer {
            layer: 0,
            gate_up: file.info(&format!("{p}.experts.gate_up_proj")).unwrap(),
            down: file.info(&format!("{p}.experts.down_proj")).unwrap(),
            experts: 2,
            width: 2,
            hidden: 3,
        };
        let view = PackedSource::new(Box::new(file), &Studio, &[layer]);
        for (i, t) in planned.iter().enumerate() {
            let info = view.info(&t.name).unwrap_or_else(|| panic!("{}", t.name));
            assert_eq!(info.shape, t.shape, "{}", t.name);
            assert_eq!(view.read_f32(&t.name).unwrap(), values(i, t.shape.iter().product()), "{}", t.name);
        }
        let down0 = expert_weight_name(0, 0, Proj::Down);
        assert_eq!(view.read_f32_range(&down0, 2..5).unwrap(), view.read_f32(&down0).unwrap()[2..5]);
        assert!(view.read_f32_range(&down0, 2..7).is_err(), "past the expert's own slice");
        assert!(view.info(&format!("{p}.experts.gate_up_proj")).is_none(), "the packed tensor is hidden");
    }

    #[test]
    fn a_plan_with_an_incomplete_expert_cannot_be_packed() {
        let mut planned = plan();
        planned.retain(|t| t.name != expert_weight_name(0, 1, Proj::Down));
        let e = Packing::new(&Studio, &planned).unwrap_err().to_string();
        assert!(e.contains("layer 0") && e.contains("5 expert tensors for 2 experts"), "{e}");
        assert_eq!(ExpertsFormat::parse("packed").unwrap(), ExpertsFormat::Packed);
        assert!(ExpertsFormat::parse("stacked").unwrap_err().to_string().contains("per-expert or packed"));
    }
}
