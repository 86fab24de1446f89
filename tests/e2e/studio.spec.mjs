// The browser studio end to end on stories260K: bad input first (the page
// must keep working), then load demo -> upcycle -> logits check -> ridge
// router on two corpora -> graft -> MoErge (CPU and WebGPU) + router ->
// download, comparing the downloads with
// the CLI's outputs for the same inputs. Screenshots of every page go to
// E2E_SHOTS (docs/screenshots/ with UPDATE_SCREENSHOTS=1).
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { hugeConfig, tinyLlama } from './fixtures.mjs';

const sha = (p) => crypto.createHash('sha256').update(fs.readFileSync(p)).digest('hex');

/** Reads a safetensors file into { name: Float32Array } (F32 only). */
function readTensors(p) {
  const b = fs.readFileSync(p);
  const n = Number(b.readBigUInt64LE(0));
  const h = JSON.parse(b.subarray(8, 8 + n).toString());
  const out = {};
  for (const [k, v] of Object.entries(h)) {
    if (k === '__metadata__') continue;
    const [s, e] = v.data_offsets;
    const buf = b.subarray(8 + n + s, 8 + n + e);
    out[k] = new Float32Array(buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength));
  }
  return out;
}

/** Names of the tensors whose bytes differ between two safetensors files. */
function bytesDiffering(a, b) {
  const raw = (p) => {
    const buf = fs.readFileSync(p);
    const n = Number(buf.readBigUInt64LE(0));
    const h = JSON.parse(buf.subarray(8, 8 + n).toString());
    delete h.__metadata__;
    return { buf, h, base: 8 + n };
  };
  const A = raw(a), B = raw(b);
  const names = Object.keys(A.h);
  if (names.length !== Object.keys(B.h).length) throw new Error(`tensor count ${names.length} vs ${Object.keys(B.h).length}`);
  return names.filter((k) => {
    if (!B.h[k]) return true;
    const [s, e] = A.h[k].data_offsets, [t, f] = B.h[k].data_offsets;
    return A.h[k].dtype !== B.h[k].dtype || JSON.stringify(A.h[k].shape) !== JSON.stringify(B.h[k].shape)
      || !A.buf.subarray(A.base + s, A.base + e).equals(B.buf.subarray(B.base + t, B.base + f));
  });
}

/** max |a - b| per tensor; tensors whose bytes differ. */
function compareTensors(a, b) {
  const A = readTensors(a), B = readTensors(b);
  const names = Object.keys(A);
  if (names.length !== Object.keys(B).length) throw new Error(`tensor count ${names.length} vs ${Object.keys(B).length}`);
  let maxDiff = 0; const differing = [];
  for (const k of names) {
    if (!B[k] || B[k].length !== A[k].length) throw new Error(`tensor ${k} missing or misshapen`);
    let m = 0;
    for (let i = 0; i < A[k].length; i++) m = Math.max(m, Math.abs(A[k][i] - B[k][i]));
    if (m > 0) differing.push(`${k} (max ${m.toExponential(2)})`);
    maxDiff = Math.max(maxDiff, m);
  }
  return { maxDiff, differing, tensors: names.length };
}

/**
 * Installs a Long Tasks observer before the studio's scripts run: every
 * main-thread task over 50 ms lands in `window.__longTasks` as
 * `{ start, duration }` (ms, `performance.now()` clock). Where the browser
 * has the Long Animation Frames API, every frame over 50 ms lands in
 * `window.__longFrames` with what filled it (the scripts that ran, by
 * invoker and source file, and the style, layout and paint time), so a
 * long task can be told to be the studio's code or the browser's work.
 */
export async function observeLongTasks(page) {
  await page.addInitScript(() => {
    window.__longTasks = [];
    try {
      new PerformanceObserver((list) => {
        for (const e of list.getEntries()) window.__longTasks.push({ start: e.startTime, duration: e.duration });
      }).observe({ type: 'longtask', buffered: true });
    } catch { window.__longTasks = null; }
    window.__longFrames = [];
    try {
      new PerformanceObserver((list) => {
        for (const e of list.getEntries()) {
          window.__longFrames.push({
            start: e.startTime,
            duration: e.duration,
            render_ms: e.renderStart ? e.startTime + e.duration - e.renderStart : 0,
            scripts: (e.scripts || []).map((x) => ({
              invoker: x.invoker, file: (x.sourceURL || '').split('/').pop(), fn: x.sourceFunctionName, ms: Math.round(x.duration),
            })),
          });
        }
      }).observe({ type: 'long-animation-frame', buffered: true });
    } catch { window.__longFrames = null; }
  });
}

/**
 * What filled the long animation frames that overlap main-thread task `t`
 * (`{ start, duration }`), in one line: each frame's scripts (invoker,
 * file, ms) and its render time; '' when none was recorded.
 */
export async function whatFilled(page, t) {
  const frames = await page.evaluate(() => window.__longFrames || []);
  return frames
    .filter((f) => f.start <= t.start + t.duration && f.start + f.duration >= t.start)
    .map((f) => `frame ${f.duration.toFixed(0)} ms: ${f.scripts.map((x) => `${x.invoker} [${x.file}${x.fn ? ` ${x.fn}` : ''}] ${x.ms} ms`).join(', ') || 'no script'}; render ${f.render_ms.toFixed(0)} ms`)
    .join(' | ');
}

/**
 * The page's clock now and the longest main-thread task since `from`,
 * leaving out the `skip` windows ([from, to] pairs; the forward benchmark
 * runs on the page on purpose). `null` when the browser has no Long Tasks
 * API.
 */
export async function longestTask(page, from, skip = []) {
  const { now, lt } = await page.evaluate(() => ({ now: performance.now(), lt: window.__longTasks }));
  if (!lt) return { now, longest: null };
  const ds = lt.filter((t) => t.start >= from && !overlaps(t, skip)).map((t) => t.duration);
  return { now, longest: ds.length ? Math.max(...ds) : 0 };
}

/** Whether main-thread task `t` (`{ start, duration }`) overlaps one of `spans` (`[from, to]` pairs). */
function overlaps(t, spans) {
  return spans.some(([a, b]) => t.start + t.duration >= a && t.start <= b);
}

/**
 * A full-page screenshot to `file`; its window on the page's clock
 * (`[from, to]`, ms) is pushed to `spans`. Playwright makes the browser lay
 * out and paint the whole page for it, a main-thread cost no user action
 * makes, so the long-task checks leave these windows out.
 */
export async function screenshotSpan(page, file, spans) {
  const from = await page.evaluate(() => performance.now());
  await page.screenshot({ path: file, fullPage: true });
  spans.push([from, await page.evaluate(() => performance.now())]);
}

/**
 * The five longest main-thread tasks since `from`, longest first, each
 * `{ start, duration, part, left_out, filled_by }`: `part` is the last of
 * `marks` (`[name, at]` pairs, the page's clock) before it; `left_out` the
 * name of the first `leftOut` entry (`{ name: spans }`) whose windows it
 * overlaps, else null; `filled_by` what filled it (`whatFilled`) when it
 * lasted 100 ms or more, else ''.
 */
export async function longestTasks(page, from, marks, leftOut = {}) {
  const lt = await page.evaluate(() => window.__longTasks || []);
  const top = lt.filter((t) => t.start >= from).sort((a, b) => b.duration - a.duration).slice(0, 5).map((t) => ({
    ...t,
    part: (marks.filter(([, at]) => at <= t.start).pop() || ['before'])[0],
    left_out: Object.entries(leftOut).find(([, spans]) => overlaps(t, spans))?.[0] ?? null,
  }));
  for (const t of top) t.filled_by = t.duration >= 100 ? await whatFilled(page, t) : '';
  return top;
}

/** `longestTasks`' list in one log line ('none' when empty). */
export function longTasksLine(top) {
  return top.map((t) => `${t.duration.toFixed(0)} ms in ${t.part} at ${t.start.toFixed(0)}`
    + (t.left_out ? ` (during the ${t.left_out}: left out)` : '')
    + (t.filled_by ? ` [what filled it: ${t.filled_by}]` : '')).join('; ') || 'none';
}

export async function run({ context, url, work, shots, out, check, log }) {
  const page = await context.newPage();
  await observeLongTasks(page);
  const pageErrors = [];
  page.on('pageerror', (e) => pageErrors.push(String(e)));
  // A static server answers the studio's `api/health` probe with 404: expected.
  page.on('console', (m) => { if (m.type() === 'error' && !m.text().includes('404')) pageErrors.push(m.text()); });
  const tid = (id) => page.getByTestId(id);
  // The test's own full-page screenshots (`screenshotSpan`), left out of
  // the suite's long-task check.
  const shotSpans = [];
  const shot = (name, dir = shots) => screenshotSpan(page, path.join(dir, `${name}.png`), shotSpans);
  const text = async (id, timeout = 120_000) => { await tid(id).waitFor({ timeout }); return tid(id).innerText(); };
  const tab = async (slug) => { await tid(`tab-${slug}`).click(); await tid(`page-${slug}`).waitFor(); };
  const results = {};

  const tGoto = Date.now();
  await page.goto(url);
  await tid('tab-load').waitFor();
  // Real readiness: the worker says `Ready` as soon as its module runs (it
  // gets the page's compiled module; WebGPU starts beside it and never
  // delays it), then the badge resolves: WebGPU, or the CPU fallback with
  // its reason (the worker's own timeout bounds the wait).
  await tid('worker-ready').waitFor({ timeout: 60_000 });
  results.worker_ready_ms = Date.now() - tGoto;
  const gpu = await text('webgpu', 60_000);
  results.webgpu_ms = Date.now() - tGoto;
  results.webgpu = gpu;
  log(`worker ready after ${results.worker_ready_ms} ms; WebGPU badge after ${results.webgpu_ms} ms: ${gpu}`);
  if (!gpu.includes('WebGPU:')) log(`WebGPU reason: ${await text('webgpu-reason', 1_000).catch(() => '?')}`);
  // The tabs are history entries: Back and Forward show the page the URL
  // names, and Back to the entry the studio opened on (no hash) is Load.
  {
    await tab('upcycle');
    await tab('moerge');
    await page.goBack();
    const back1 = await tid('page-upcycle').waitFor({ timeout: 5_000 }).then(() => true, () => false);
    await page.goBack();
    const back2 = await tid('page-load').waitFor({ timeout: 5_000 }).then(() => true, () => false);
    await page.goForward();
    const fwd = await tid('page-upcycle').waitFor({ timeout: 5_000 }).then(() => true, () => false);
    check(back1 && back2 && fwd && page.url().endsWith('#upcycle'),
      `Back, Back, Forward over the tabs show Upcycle, Load, Upcycle (${back1}, ${back2}, ${fwd}; ${page.url()})`);
    await tab('load');
  }
  // Issue 19 item 1: from here on (the studio is up) no main-thread task
  // may last 100 ms, except the forward benchmark, which runs on the page
  // on purpose. Each step's wall time and longest task go to `results.steps`.
  const clock = () => page.evaluate(() => performance.now());
  const suiteFrom = await clock();
  const skip = [];
  results.steps = {};
  // Where each part of the suite starts on the page's clock (to name the
  // part a long main-thread task fell in).
  const marks = [];
  const mark = async (name) => marks.push([name, await clock()]);
  const timed = async (name, f) => {
    const from = await clock();
    const t = Date.now();
    const r = await f();
    const { longest } = await longestTask(page, from, skip);
    results.steps[name] = { wall_ms: Date.now() - t, longest_task_ms: longest };
    log(`step ${name}: ${Date.now() - t} ms wall, longest main-thread task ${longest ?? 'n/a'} ms`);
    return r;
  };

  await mark('bad input');
  // ---- Bad input: wrong type, too large; the page keeps working.
  const junk = path.join(work, 'notes.txt');
  fs.writeFileSync(junk, 'not a model');
  await tid('model-files').setInputFiles(junk);
  const e1 = await text('load-error');
  check(e1.includes('unsupported file type'), `wrong file type -> readable message (${e1})`);
  await tid('model-files').setInputFiles(hugeConfig(path.join(work, 'huge')));
  const e2 = await text('load-error');
  check(e2.includes('too large for the browser'), `70B config -> too large message (${e2.slice(0, 90)}...)`);
  const truncated = path.join(work, 'truncated.gguf');
  fs.writeFileSync(truncated, Buffer.from('GGUF\x03\x00\x00\x00garbage'));
  await tid('model-files').setInputFiles(truncated);
  const e3 = await text('load-error');
  check(e3.length > 10, `truncated GGUF -> readable message (${e3.slice(0, 90)})`);

  await mark('load');
  // ---- Load: demo + the instruct model (HF files) + a mismatched tiny model.
  await tid('load-demo').click();
  await page.getByText('loaded stories260K').waitFor({ timeout: 60_000 });
  // The tab's forward pass (the wasm the studio ships, window.wasmBindings
  // from index.html) beside the native CLI on the same machine (run.sh wrote
  // native_forward.json with `moe-studio bench prefill`, same ids).
  const benchFrom = await clock();
  const tabFwd = JSON.parse(await page.evaluate(() => window.wasmBindings.bench_forward(128, 5)));
  skip.push([benchFrom, await clock()]);
  results.tab_forward = tabFwd;
  check(tabFwd.tokens === 128 && tabFwd.tokens_per_s > 0, `the tab's forward runs (${tabFwd.model})`);
  let nativeFwd = null;
  try { nativeFwd = JSON.parse(fs.readFileSync(path.join(work, 'native_forward.json'), 'utf8')); } catch { /* not made */ }
  results.native_forward = nativeFwd;
  log(`tab forward, stories260K, 128 tokens: ${tabFwd.tokens_per_s.toFixed(0)} tokens/s (${tabFwd.backend})` +
      (nativeFwd ? `; native CLI (${nativeFwd.backend}): ${nativeFwd.ours.median.toFixed(0)} tokens/s` : ''));
  await tid('model-name').fill('stories260K-instruct');
  await tid('model-files').setInputFiles(['model.safetensors', 'config.json', 'tokenizer.json'].map((f) => path.join(work, 'ft', f)));
  await page.getByText(/loaded stories260K-instruct/).waitFor({ timeout: 60_000 });
  await tid('model-name').fill('tiny-other-architecture');
  await tid('model-files').setInputFiles(tinyLlama(path.join(work, 'tiny')));
  await page.getByText(/loaded tiny-other-architecture: llama · 1 layers/).waitFor({ timeout: 60_000 });
  await shot('load');

  await mark('upcycle');
  // ---- Upcycle (2 experts, top-2, expert 0 frozen) + logits check.
  await tab('upcycle');
  await tid('upcycle-model').selectOption('i0');
  await tid('upcycle-experts').fill('65');
  const e65 = await text('upcycle-error-experts');
  check(e65.includes('at most 64'), `65 experts -> refused next to the field (${e65})`);
  await tid('upcycle-experts').fill('2');
  await tid('param-counts').waitFor();
  const t0 = Date.now();
  const up = await timed('upcycle', async () => { await tid('upcycle-run').click(); return text('upcycle-ok'); });
  results.upcycle = { message: up, wall_ms: Date.now() - t0 };
  const lg = await timed('logits check', async () => { await tid('logits-run').click(); return text('logits-ok'); });
  const diff = Number(/=\s*([0-9.eE+-]+)/.exec(lg)[1]);
  results.logits_max_abs_diff = diff;
  check(diff < 1e-4, `logits check passes: max |dense - MoE| = ${diff}`);
  await shot('upcycle');
  // The Load page counts the MoE's parameters (stories260K, 2 experts in 5 layers), not the dense ones.
  await tab('load');
  const params = await text('params-a0');
  results.upcycled_params = params;
  check(params.startsWith('425.8K'), `Load page: the upcycled MoE has 425.8K parameters (${params})`);

  await mark('router');
  // ---- Ridge router on two corpora (expert 0 = en, expert 1 = hu).
  await tab('moerge');
  // Bad input: three domains for a two-expert MoE.
  await page.getByText('+ domain').click();
  await tid('route-run').click();
  const e4 = await text('route-error');
  check(e4.includes('2 experts but 3 domains'), `mismatched domains -> readable message (${e4})`);
  await page.getByText('− domain').click();
  for (const [i, lang] of [[0, 'en'], [1, 'hu']]) {
    await tid(`domain-file-${i}`).setInputFiles(path.join(work, `${lang}.txt`));
    await tid(`domain-name-${i}`).fill(lang);
  }
  await page.waitForFunction(() => document.querySelector('[data-testid=domain-text-1]').value.length > 1000);
  await tid('route-model').selectOption('a0');
  // The server's rules in the tab (issue 19 item 2): top-k 0 is refused
  // next to the fields, before any work (it used to panic the wasm).
  await tid('route-topk').fill('0');
  const ek = await text('route-field-error', 10_000);
  const disabled = await tid('route-run').isDisabled();
  check(ek.includes('top-k: 0 is out of range 1..=64') && disabled,
    `router top-k 0 refused next to the field, button disabled (${ek}; disabled ${disabled})`);
  await tid('route-topk').fill('1');
  await tid('route-field-error').waitFor({ state: 'detached', timeout: 10_000 });
  // Cancel (issue 19 item 1): the worker is terminated and restarted, the
  // task stops within a second, the kept models come back.
  {
    await tid('route-run').click();
    await tid('progress').waitFor({ timeout: 30_000 });
    const t = Date.now();
    await tid('cancel').click();
    const e = await text('route-error', 10_000);
    const dt = Date.now() - t;
    results.cancel = { message: e, ms: dt };
    check(e.includes('cancelled') && dt < 1000, `Cancel stops the router within a second (${dt} ms: ${e.slice(0, 80)})`);
    const note = await page.getByText(/restored \d+ model\(s\) kept in this browser/).innerText({ timeout: 60_000 });
    check(/restored [1-9]/.test(note), `... and the restarted worker restores the kept models (${note.slice(0, 120)})`);
    await tid('route-model').selectOption('a0');
  }
  const t1 = Date.now();
  const rt = await timed('router', async () => { await tid('route-run').click(); return text('route-ok', 300_000); });
  results.route = { message: rt, wall_ms: Date.now() - t1 };
  await tid('ppl-table').waitFor();
  await shot('moerge-router');

  await mark('graft');
  // ---- Graft: bad input first (a model from another architecture).
  await tab('graft');
  await tid('graft-target').selectOption('a1');
  await tid('graft-base').selectOption('i0');
  await tid('graft-instruct').selectOption('i2');
  await tid('graft-run').click();
  const e5 = await text('graft-error');
  check(/base|instruct|vocabular|shape|missing/.test(e5), `mismatched models -> readable message (${e5.slice(0, 120)})`);
  await tid('graft-instruct').selectOption('i1');
  const t2 = Date.now();
  await tid('graft-run').click();
  const gr = await text('graft-ok', 120_000);
  results.graft = { message: gr, wall_ms: Date.now() - t2 };
  if (gpu.includes('WebGPU:')) check(gr.includes('on WebGPU'), 'with a WebGPU adapter the graft runs on the WGSL kernel');
  await tid('delta-table').waitFor();
  await shot('graft');
  // The same graft on the upcycled MoE (artifact 3), compared by sha256 below.
  await tid('graft-target').selectOption('a0');
  await tid('graft-run').click();
  await page.getByText(/made stories260K-upcycled-2x-grafted/).waitFor({ timeout: 120_000 });

  await mark('moerge');
  // ---- MoErge stories260K + its fine-tuned copy (two dense models: every
  // shared tensor is a two-model mean), on the CPU and on the WGSL kernel,
  // then the ridge router on the MoErged model; compared with the CLI below.
  await tab('moerge');
  await tid('moerge-pick-i0').check();
  await tid('moerge-pick-i1').check();
  for (const [useGpu, key, artifact] of [[false, 'moerge_cpu', 4], [true, 'moerge', 5]]) {
    await tid('moerge-use-gpu').setChecked(useGpu);
    const t = Date.now();
    await tid('moerge-run').click();
    // The Download page (mounted, hidden) lists the new artifact when done.
    await tid(`artifact-${artifact}`).waitFor({ state: 'attached', timeout: 120_000 });
    const m = await text('moerge-ok');
    results[key] = { message: m, wall_ms: Date.now() - t };
    log(`MoErge (${useGpu ? 'WebGPU if granted' : 'CPU'}): ${m}`);
    if (!useGpu) check(/averaged 32 shared tensors on the CPU/.test(m), `MoErge with the kernel unchecked averages on the CPU (${m})`);
  }
  if (gpu.includes('WebGPU:')) {
    const m = /averaged (\d+) shared tensors on WebGPU and (\d+) on the CPU/.exec(results.moerge.message);
    check(m && Number(m[1]) === 32 && Number(m[2]) === 0,
      `with a WebGPU adapter MoErge averages all 32 shared tensors on the WGSL kernel (${results.moerge.message})`);
  }
  await tid('route-model').selectOption('a5');
  // The byte comparison with the CLI needs the CLI's f64 statistics (the
  // WGSL Gram sums f32 blocks: routers within ~3e-5 of the CLI's here).
  await tid('route-gram-gpu').setChecked(false);
  const t3 = Date.now();
  await tid('route-run').click();
  await tid('artifact-6').waitFor({ state: 'attached', timeout: 300_000 });
  results.moerge_route = { message: await text('route-ok'), wall_ms: Date.now() - t3 };

  await mark('inspect');
  // ---- Inspect the routed model.
  await tab('inspect');
  await tid('inspect-model').selectOption('a1');
  await tid('inspect-layer').fill('3');
  const toks = await timed('inspect', async () => { await tid('inspect-run').click(); return text('inspect-tokens'); });
  check(toks.startsWith('Once upon a time there was') && !toks.includes('\uFFFD'), `Inspect shows the tokens with their spaces (${toks.slice(0, 40)}...)`);
  await shot('inspect');

  await mark('neurons');
  // ---- Neurons on the dense model.
  await tab('neurons');
  await tid('neurons-model').selectOption('i0');
  const nr = await timed('neurons', async () => { await tid('neurons-run').click(); return text('neurons-ok', 120_000); });
  results.neurons = nr;
  await tid('allocation').waitFor();
  await shot('neurons');
  // Issue 20: with two texts per language a neuron unrelated to the
  // language still separates them perfectly with probability 1/C(4, 2), so
  // ~500 of the 3000 neurons reach AP = 1 and tie at the top-100 cut-off;
  // the page says so. (The ten default texts per language give AP 0.95 at
  // the cut-off on stories260K: no tie.)
  const fewTexts = { 0: 'The cat sat on the mat.\nTom likes to play with his red ball.', 1: 'A macska a szőnyegen ült.\nTomi szeret a piros labdájával játszani.' };
  const defaults = [];
  for (const [i, t] of Object.entries(fewTexts)) {
    defaults.push(await tid(`neurons-text-${i}`).inputValue());
    await tid(`neurons-text-${i}`).fill(t);
  }
  await tid('neurons-run').click();
  await page.getByText(/analysed 3000 neurons on 4 texts/).waitFor({ timeout: 120_000 });
  // One warning per language whose cut-off ties (both here): the first.
  const tie = await tid('neurons-warning-tie').first().innerText({ timeout: 5_000 }).catch(() => '');
  results.neurons_tie_warning = tie;
  results.neurons_two_texts = { cuts: await text('neurons-cuts', 5_000).catch(() => ''), message: await text('neurons-ok', 5_000).catch(() => '') };
  log(`Neurons on two texts per language: ${JSON.stringify(results.neurons_two_texts)}`);
  await shot('neurons-two-texts', out);
  check(/tie/i.test(tie), `Neurons on two texts per language shows the tie warning (${tie.slice(0, 120)})`);
  for (const [i, t] of defaults.entries()) await tid(`neurons-text-${i}`).fill(t);

  await mark('download');
  // ---- Download and compare with the CLI.
  await tab('download');
  await tid('artifact-2').waitFor();
  await shot('download');
  const save = async (id, name) => {
    const [dl] = await Promise.all([page.waitForEvent('download'), tid(id).click()]);
    const p = path.join(out, name);
    await dl.saveAs(p);
    return p;
  };
  const cli = path.join(work, 'cli');
  const upB = await save('dl-0-model.safetensors', 'upcycled.safetensors');
  const upSame = sha(upB) === sha(path.join(cli, 'upcycled', 'model.safetensors'));
  results.upcycle_sha256 = { browser: sha(upB), cli: sha(path.join(cli, 'upcycled', 'model.safetensors')), equal: upSame };
  check(upSame, `upcycle download sha256 == CLI (${sha(upB).slice(0, 16)})`);
  const upCfg = await save('dl-0-config.json', 'upcycled-config.json');
  const stripProv = (p) => { const j = JSON.parse(fs.readFileSync(p)); delete j.moe_studio?.provenance; return JSON.stringify(j); };
  check(stripProv(upCfg) === stripProv(path.join(cli, 'upcycled', 'config.json')), 'upcycle config.json == CLI (except provenance paths)');
  for (const [i, name] of [[1, 'routed'], [2, 'grafted']]) {
    const b = await save(`dl-${i}-model.safetensors`, `${name}.safetensors`);
    const c = path.join(cli, name, 'model.safetensors');
    const same = sha(b) === sha(c);
    const cmp = compareTensors(b, c);
    results[`${name}_sha256`] = { browser: sha(b), cli: sha(c), equal: same, max_abs_diff: cmp.maxDiff, differing_tensors: cmp.differing };
    const onlyRouters = cmp.differing.every((d) => d.includes('block_sparse_moe.gate.'));
    // The router of this model was solved from the WGSL Gram when WebGPU
    // was granted (f32 block sums vs the CLI's f64): routers may differ by
    // rounding (3e-5 measured), every other tensor must be byte-identical.
    // On the CPU path the statistics are the CLI's f64 and the file must be.
    const gpuGram = /Gram on WebGPU/.test(results.route?.message || '');
    const tol = gpuGram ? 1e-4 : 1e-5;
    check(same || (cmp.maxDiff < tol && onlyRouters),
      `${name} download vs CLI (${gpuGram ? 'WGSL Gram, routers within 1e-4' : 'CPU Gram'}): sha256 ${same ? 'equal' : 'differs'}; max |diff| ${cmp.maxDiff.toExponential(2)} over ${cmp.tensors} tensors; differing: ${cmp.differing.join(', ') || 'none'}`);
  }

  const gu = await save('dl-3-model.safetensors', 'grafted-upcycled.safetensors');
  const guCli = path.join(cli, 'grafted-upcycled', 'model.safetensors');
  results.grafted_upcycled_sha256 = { browser: sha(gu), cli: sha(guCli), equal: sha(gu) === sha(guCli) };
  check(sha(gu) === sha(guCli), `graft (on the upcycled MoE) download sha256 == CLI (${sha(gu).slice(0, 16)})`);

  // MoErge (CPU: artifact 4, WebGPU: 5) vs the CLI: the whole file; then the
  // MoErged model routed (6): every non-router tensor byte-identical.
  const mgCli = path.join(cli, 'moerged', 'model.safetensors');
  for (const [i, key] of [[4, 'moerge_cpu'], [5, 'moerge']]) {
    const b = await save(`dl-${i}-model.safetensors`, `${key}.safetensors`);
    const differing = bytesDiffering(b, mgCli);
    results[`${key}_sha256`] = { browser: sha(b), cli: sha(mgCli), equal: sha(b) === sha(mgCli), differing_tensors: differing };
    check(sha(b) === sha(mgCli), `${key === 'moerge' ? 'MoErge (WebGPU path)' : 'MoErge (CPU path)'} download sha256 == CLI (${sha(b).slice(0, 16)}; differing tensors: ${differing.join(', ') || 'none'})`);
  }
  const mgCfg = await save('dl-5-config.json', 'moerged-config.json');
  check(stripProv(mgCfg) === stripProv(path.join(cli, 'moerged', 'config.json')), 'MoErge config.json == CLI (except provenance)');
  {
    const b = await save('dl-6-model.safetensors', 'moerged-routed.safetensors');
    const c = path.join(cli, 'moerged-routed', 'model.safetensors');
    const differing = bytesDiffering(b, c);
    const nonRouter = differing.filter((n) => !n.includes('block_sparse_moe.gate.'));
    const cmp = compareTensors(b, c);
    results.moerged_routed_sha256 = { browser: sha(b), cli: sha(c), equal: sha(b) === sha(c), max_abs_diff: cmp.maxDiff, differing_tensors: differing };
    check(nonRouter.length === 0 && cmp.maxDiff < 1e-5,
      `MoErge + router download vs CLI: non-router tensors byte-identical (${cmp.tensors - differing.length} of ${cmp.tensors} identical; differing: ${differing.join(', ') || 'none'}); routers max |diff| ${cmp.maxDiff.toExponential(2)}`);
  }

  await mark('jobs');
  // ---- Jobs (static server: disabled with a notice).
  await tab('jobs');
  await tid('jobs-static').waitFor({ timeout: 10_000 });
  await shot('jobs');

  // Issue 19 item 1: the page never blocked for 100 ms (the forward
  // benchmark and the test's own screenshots left out).
  const { longest } = await longestTask(page, suiteFrom, [...skip, ...shotSpans]);
  results.longest_main_thread_task_ms = longest;
  results.longest_main_thread_tasks = await longestTasks(page, suiteFrom, marks, { 'forward benchmark': skip, screenshot: shotSpans });
  log(`longest main-thread tasks: ${longTasksLine(results.longest_main_thread_tasks)}`);
  check(longest !== null && longest < 100,
    `longest main-thread task over the suite (the forward benchmark and ${shotSpans.length} full-page screenshots left out): ${longest} ms < 100 ms`);

  check(pageErrors.length === 0, `no page errors (${pageErrors.slice(0, 3).join(' | ')})`);
  await page.close();

  // A panic inside a task becomes a message on the page, the worker is
  // restarted and the tab stays usable (`?inject-panic`: the first task
  // panics in the worker).
  {
    const p2 = await context.newPage();
    await p2.goto(`${url}?inject-panic#load`);
    await p2.getByTestId('load-demo').click();
    const e = await p2.getByTestId('load-error').innerText({ timeout: 30_000 });
    check(e.includes('crashed') && e.includes('injected'), `an injected panic becomes a message on the page (${e.slice(0, 120)})`);
    await p2.getByTestId('load-demo').click();
    await p2.getByText(/loaded stories260K/).first().waitFor({ timeout: 60_000 });
    check(true, '... and the tab stays usable: the demo loads after it');
    await p2.close();
  }
  return results;
}
