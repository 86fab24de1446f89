// The Jobs page against a real `moe-studio serve` (started by
// run_backend.sh): chunked upload of stories260K with an interruption, a
// reload and a resume; checkpoint registration (sha256 equal to the source
// files, via the API); a corpus upload; an upcycle job and a short
// `experts`-stage training job followed live over server-sent events; the
// artefact downloaded from the page (bytes equal to the API's); the output
// model opened in the browser studio; a cancelled and resumed training job;
// then the other job kinds from the form: a 3-step dense fine-tune, a
// MoErge of it with stories260K (first with top_k above the experts: the
// server's 422 shown next to the top-k input), a graft onto the upcycled
// MoE (both outputs listed with their layers and experts) and an eval of
// the trained MoE on the hu text (perplexity shown = result.json's).
// Env: E2E_URL, E2E_TOKEN_FILE, E2E_MODEL_DIR, E2E_CORPUS, E2E_OUT,
// E2E_SHOTS, E2E_TMP; UPDATE_SCREENSHOTS=1 writes docs/screenshots/jobs.png.
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { launch } from './browser.mjs';

const env = (k) => { if (!process.env[k]) throw new Error(`${k} is not set (use run_backend.sh)`); return process.env[k]; };
const url = env('E2E_URL');
const token = fs.readFileSync(env('E2E_TOKEN_FILE'), 'utf8').trim();
const modelDir = env('E2E_MODEL_DIR');
const corpus = env('E2E_CORPUS');
const out = env('E2E_OUT');
const tmp = env('E2E_TMP');
const shots = process.env.UPDATE_SCREENSHOTS === '1' ? env('E2E_SHOTS') : out;
fs.mkdirSync(out, { recursive: true });
fs.mkdirSync(shots, { recursive: true });

const CHUNK_KIB = Number(process.env.E2E_CHUNK_KIB || 64);
const INTERRUPT_AT = 5;
const TRAIN_STEPS = Number(process.env.E2E_TRAIN_STEPS || 12);

let failures = 0;
const check = (ok, what) => { console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}`); if (!ok) failures++; return ok; };
const log = (s) => console.log(`     ${s}`);
const sha = (buf) => crypto.createHash('sha256').update(buf).digest('hex');
const shaFile = (p) => sha(fs.readFileSync(p));
const api = async (p) => {
  // Reads need the token too (issue 18).
  const r = await fetch(new URL(`api/${p}`, url), { headers: { Authorization: `Bearer ${token}` } });
  if (!r.ok) throw new Error(`GET api/${p}: HTTP ${r.status} ${await r.text()}`);
  return r;
};
const apiJson = async (p) => (await api(p)).json();
const apiBytes = async (p) => Buffer.from(await (await api(p)).arrayBuffer());

const modelBin = path.join(modelDir, 'stories260K.bin');
const tokBin = path.join(modelDir, 'tok512.bin');
const results = { chunk_size: CHUNK_KIB * 1024 };
const t0 = Date.now();

const browser = await launch([]);
const page = await browser.context.newPage();
const pageErrors = [];
page.on('pageerror', (e) => pageErrors.push(String(e)));
// Expected console errors: the studio's `api/health` probe (404 here),
// the chunk request the test aborts and the invalid job the test submits (422).
page.on('console', (m) => {
  const t = m.text();
  if (m.type() === 'error' && !/404|422|ERR_INTERNET_DISCONNECTED|ERR_FAILED|Failed to fetch/.test(t)) pageErrors.push(t);
});
const tid = (id) => page.getByTestId(id);
// The message line counts its messages (data-seq): wait for one after `since`.
const msgSeq = async () => Number(await tid('jobs-msg').getAttribute('data-seq'));
let since = 0;
const clearMsg = async () => { since = await msgSeq(); };
const okMsg = async (timeout = 120_000) => {
  await page.waitForFunction((n) => Number(document.querySelector('[data-testid=jobs-msg]')?.dataset.seq) > n
    && document.querySelector('[data-testid=jobs-ok], [data-testid=jobs-error]'), since, { timeout });
  const err = await tid('jobs-error').count();
  if (err) throw new Error(`the page says: ${await tid('jobs-error').innerText()}`);
  return tid('jobs-ok').innerText();
};
const openJobs = async () => {
  await page.goto(`${url}#jobs`);
  await tid('page-jobs').waitFor();
  await page.waitForFunction(() => (document.querySelector('[data-testid=server-info]')?.textContent || '').includes('moe-studio'), null, { timeout: 60_000 });
};
const chunkOf = (u) => { const m = /\/api\/uploads\/([0-9a-f-]+)\/chunks\/(\d+)$/.exec(new URL(u).pathname); return m ? { id: m[1], index: Number(m[2]) } : null; };
const chunkIndex = (u) => chunkOf(u)?.index ?? null;

try {
  // ---- the page sees the server ---------------------------------------------
  await openJobs();
  check(await tid('jobs-static').count() === 0, 'served by moe-studio serve: no static-files notice');
  log(await tid('server-info').innerText());
  await tid('jobs-token').fill(token);

  // ---- chunked upload with an interruption ----------------------------------
  const size = fs.statSync(modelBin).size;
  const chunks = Math.ceil(size / (CHUNK_KIB * 1024));
  results.upload = { file: 'stories260K.bin', bytes: size, chunks, interrupted_at_chunk: INTERRUPT_AT };
  let aborted = 0;
  const sent = [];
  page.on('request', (r) => { const c = chunkOf(r.url()); if (c && r.method() === 'PUT') sent.push(c); });
  await page.route((u) => chunkIndex(u.href) === INTERRUPT_AT, async (route) => {
    if (aborted++ === 0) return route.abort('internetdisconnected');
    return route.continue();
  });
  await tid('upload-chunk-kib').fill(String(CHUNK_KIB));
  await tid('upload-files').setInputFiles([modelBin, tokBin]);
  await tid('upload-start').click();
  await tid('jobs-error').waitFor({ timeout: 60_000 });
  const errText = await tid('jobs-error').innerText();
  check(/Resume/.test(errText), `the interruption is reported with a hint to resume: "${errText.slice(0, 140)}"`);
  check(await tid('upload-resume').count() === 1, 'one unfinished upload is listed with a Resume button');
  const pending = JSON.parse(await page.evaluate(() => localStorage.getItem('moe-studio.pending-uploads')));
  check(pending.length === 1 && pending[0].file_name === 'stories260K.bin', 'the unfinished upload is remembered in localStorage');
  const before = await apiJson(`uploads/${pending[0].id}`);
  check(before.chunks_received === INTERRUPT_AT && before.state === 'uploading',
    `the server holds chunks 0..${before.chunks_received} of ${before.chunks_total} (state ${before.state})`);

  // ---- reload (the tab forgets the File), pick again, resume -----------------
  await page.reload();
  await openJobs();
  check(await tid('jobs-token').inputValue() === token, 'the token survives the reload (localStorage)');
  const sentBeforeResume = sent.length;
  await tid('upload-resume-files').setInputFiles([modelBin, tokBin]);
  await clearMsg();
  await tid('upload-resume').click();
  const resumed = await okMsg();
  check(/stories260K\.bin/.test(resumed) && /tok512\.bin/.test(resumed), `resume completes both files: "${resumed}"`);
  const after = sent.slice(sentBeforeResume).filter((c) => c.id === pending[0].id).map((c) => c.index);
  results.upload.resumed_from_chunk = Math.min(...after);
  results.upload.chunk_requests_after_resume = after.length;
  check(after[0] === INTERRUPT_AT && after.length === chunks - INTERRUPT_AT,
    `the resume sends chunks ${after[0]}..${after.at(-1)} (${after.length}; none of 0..${INTERRUPT_AT - 1} again)`);
  check(await tid('upload-resume').count() === 0, 'no unfinished upload is left');
  const uploads = await apiJson('uploads');
  const byName = (n) => uploads.find((u) => u.file_name === n && u.state === 'complete');
  check(byName('stories260K.bin')?.sha256 === shaFile(modelBin), 'the server verified stories260K.bin with the source sha256');
  check(byName('tok512.bin')?.sha256 === shaFile(tokBin), '... and tok512.bin');

  // ---- register the checkpoint ----------------------------------------------
  await tid('ckpt-name').fill('stories260K');
  await clearMsg();
  await tid('ckpt-register').click();
  log(await okMsg());
  const ckpts = await apiJson('checkpoints');
  const base = ckpts.find((c) => c.name === 'stories260K');
  check(!!base, 'the checkpoint is registered');
  for (const [n, p] of [['stories260K.bin', modelBin], ['tok512.bin', tokBin]]) {
    const f = base.files.find((x) => x.name === n);
    const stored = sha(await apiBytes(`checkpoints/${base.id}/files/${n}`));
    check(f?.sha256 === shaFile(p) && stored === shaFile(p), `stored ${n}: sha256 ${stored.slice(0, 16)}… equals the source (listing and bytes)`);
  }
  results.upload.sha256 = shaFile(modelBin);
  await tid(`checkpoint-${base.id}`).waitFor({ timeout: 10_000 });

  // ---- the corpus ------------------------------------------------------------
  await tid('upload-files').setInputFiles([corpus]);
  await clearMsg();
  await tid('upload-start').click();
  log(await okMsg());
  const corpusUp = (await apiJson('uploads')).find((u) => u.file_name === path.basename(corpus) && u.state === 'complete');
  check(corpusUp?.sha256 === shaFile(corpus), `corpus uploaded (${fs.readFileSync(corpus, 'utf8').split('\n').length - 1} lines, sha256 verified)`);

  // Follows the job shown in the page until it ends; returns what was seen.
  const followJob = async (timeout) => {
    await tid('job-live').waitFor();
    const id = await tid('job-live').getAttribute('data-job');
    await page.evaluate(() => {
      window.__steps = [];
      const root = document.querySelector('[data-testid=page-jobs]');
      const seen = () => {
        const s = document.querySelector('[data-testid=job-step]');
        const c = document.querySelector('[data-testid=loss-curve]');
        if (s) window.__steps.push({ step: Number(s.dataset.step), points: Number(c?.dataset.points || 0) });
      };
      new MutationObserver(seen).observe(root, { subtree: true, childList: true, characterData: true, attributes: true });
    });
    await page.waitForFunction(() => ['succeeded', 'failed', 'cancelled', 'interrupted']
      .includes(document.querySelector('[data-testid=job-state]')?.textContent), null, { timeout });
    const state = await tid('job-state').innerText();
    const steps = await page.evaluate(() => window.__steps);
    return { id, state, steps };
  };

  // ---- upcycle -----------------------------------------------------------------
  await tid('job-kind').selectOption('upcycle');
  await tid('job-model').selectOption(base.id);
  await tid('job-experts').fill('2');
  await tid('job-top_k').fill('1');
  await clearMsg();
  await tid('job-submit').click();
  log(await okMsg());
  const up = await followJob(180_000);
  const upJob = await apiJson(`jobs/${up.id}`);
  check(up.state === 'succeeded' && upJob.state === 'succeeded' && !!upJob.output_checkpoint,
    `upcycle job ${up.id.slice(0, 8)}: ${up.state}, output checkpoint ${upJob.output_checkpoint?.slice(0, 8)}`);
  results.upcycle = { job: up.id, output_checkpoint: upJob.output_checkpoint };

  // ---- experts-stage training, followed live --------------------------------
  await page.waitForFunction((id) => [...document.querySelectorAll('[data-testid=job-model] option')].some((o) => o.value === id),
    upJob.output_checkpoint, { timeout: 30_000 });
  await tid('job-kind').selectOption('train');
  await tid('job-model').selectOption(upJob.output_checkpoint);
  await tid('job-stage').selectOption('experts');
  await tid('job-steps').fill(String(TRAIN_STEPS));
  await tid('job-seq_len').fill('32');
  await tid('job-batch').fill('4');
  await tid('job-lr').fill('1e-3');
  await tid('job-seed').fill('7');
  await tid('job-data-0-upload').selectOption(corpusUp.id);
  await tid('job-data-0-name').fill('hu');
  await clearMsg();
  const tTrain = Date.now();
  await tid('job-submit').click();
  log(await okMsg());
  const tr = await followJob(300_000);
  results.train_ms = Date.now() - tTrain;
  const trJob = await apiJson(`jobs/${tr.id}`);
  const metrics = await apiJson(`jobs/${tr.id}/metrics`);
  const distinct = [...new Set(tr.steps.map((s) => s.step).filter((s) => s > 0))];
  // The job's final state can arrive before the page draws the last step's point: give the
  // curve up to 5 s to catch up (it still fails when a point never arrives).
  const curvePoints = async () => Number(await tid('loss-curve').getAttribute('data-points'));
  let pts = await curvePoints();
  for (const until = Date.now() + 5_000; pts < TRAIN_STEPS && Date.now() < until; pts = await curvePoints()) {
    await new Promise((r) => setTimeout(r, 100));
  }
  const events = Number(await tid('job-events').innerText());
  const pageLoss = Number(await tid('job-loss').innerText());
  const finalLoss = metrics.at(-1)?.loss;
  check(tr.state === 'succeeded' && trJob.state === 'succeeded', `training job ${tr.id.slice(0, 8)}: ${tr.state}`);
  check(distinct.length >= 2 && distinct.every((s, i) => i === 0 || s > distinct[i - 1]),
    `the step counter advanced live through ${distinct.length} values: ${distinct.join(', ')}`);
  check(await tid('job-step').innerText() === `${TRAIN_STEPS} / ${TRAIN_STEPS}`, `the page shows ${await tid('job-step').innerText()}`);
  check(pts === TRAIN_STEPS && metrics.length === TRAIN_STEPS, `the loss curve has ${pts} points (metrics.jsonl: ${metrics.length})`);
  check(Math.abs(pageLoss - finalLoss) < 5e-4, `the page's final loss ${pageLoss} equals the API's ${finalLoss}`);
  check(events > TRAIN_STEPS, `${events} events arrived over SSE`);
  results.train = { job: tr.id, steps: TRAIN_STEPS, seq_len: 32, batch: 4, first_loss: metrics[0]?.loss, final_loss: finalLoss,
    events, live_step_values: distinct, tokens_per_s: trJob.progress?.tokens_per_s, output_checkpoint: trJob.output_checkpoint };

  // ---- download an artefact from the page -------------------------------------
  const art = 'final/model.safetensors';
  await tid(`artifact-${art}`).waitFor({ timeout: 30_000 });
  const [dl] = await Promise.all([page.waitForEvent('download'), tid(`artifact-${art}`).click()]);
  const dlPath = path.join(tmp, 'downloaded.safetensors');
  await dl.saveAs(dlPath);
  const fromApi = await apiBytes(`jobs/${tr.id}/artifacts/${art}`);
  const dlSha = shaFile(dlPath);
  const outCkpt = await apiJson(`checkpoints/${trJob.output_checkpoint}`);
  const ckptFile = outCkpt.files.find((f) => f.name === 'model.safetensors');
  check(dlSha === sha(fromApi) && fs.statSync(dlPath).size === fromApi.length,
    `downloaded ${art}: ${fromApi.length} bytes, sha256 ${dlSha.slice(0, 16)}… equals the API's artefact`);
  check(!ckptFile?.sha256 || ckptFile.sha256 === dlSha, '... and the output checkpoint\'s model.safetensors');
  results.download = { artefact: art, bytes: fromApi.length, sha256: dlSha };

  // ---- open the output in the studio ------------------------------------------
  await clearMsg();
  await tid('job-open').click();
  const opened = await okMsg();
  check(opened.includes(outCkpt.name) && /layers/.test(opened), `Open in studio: "${opened}"`);
  await page.screenshot({ path: path.join(shots, 'jobs.png'), fullPage: true });
  await tid('tab-load').click();
  const loaded = await tid('loaded-models').innerText();
  check(loaded.includes(outCkpt.name) && /MoE, \d+ experts/.test(loaded), `the Load page lists ${outCkpt.name} as an MoE`);
  results.opened = opened;

  // ---- cancel a running training job, then resume it ----------------------------
  const LONG = Number(process.env.E2E_RESUME_STEPS || 150);
  await tid('tab-jobs').click();
  await tid('job-steps').fill(String(LONG));
  await clearMsg();
  await tid('job-submit').click();
  log(await okMsg());
  await page.waitForFunction(() => Number(document.querySelector('[data-testid=job-step]')?.dataset.step) >= 10, null, { timeout: 120_000 });
  const longId = await tid('job-live').getAttribute('data-job');
  await clearMsg();
  await tid('job-cancel').click();
  log(await okMsg());
  await page.waitForFunction(() => document.querySelector('[data-testid=job-state]')?.textContent === 'cancelled', null, { timeout: 60_000 });
  const cancelled = await apiJson(`jobs/${longId}`);
  const cancelStep = cancelled.progress?.step;
  check(cancelled.state === 'cancelled' && cancelStep < LONG, `Cancel: job ${longId.slice(0, 8)} cancelled at step ${cancelStep} of ${LONG}`);
  await clearMsg();
  await tid('job-resume').click();
  log(await okMsg());
  const re = await followJob(300_000);
  const resumedJob = await apiJson(`jobs/${longId}`);
  const reSteps = [...new Set(re.steps.map((x) => x.step).filter((x) => x > 0))];
  // The curve is complete once the page has merged the job's metrics.jsonl on its end (live
  // events a slow tab lagged past are read back from it): wait for that, then read it.
  await page.waitForFunction((n) => Number(document.querySelector('[data-testid=loss-curve]')?.getAttribute('data-points')) >= n,
    LONG, { timeout: 15_000 }).catch(() => {});
  const rePts = Number(await tid('loss-curve').getAttribute('data-points'));
  check(re.state === 'succeeded' && resumedJob.attempts === 2 && resumedJob.progress?.step === LONG,
    `Resume: ${re.state} after ${resumedJob.attempts} attempts, step ${resumedJob.progress?.step}`);
  check(reSteps.length > 0 && reSteps[0] > 1, `the resumed run continued from step ${reSteps[0]} (not from 1)`);
  check(rePts === LONG, `the loss curve holds all ${rePts} steps (before and after the resume)`);
  results.cancel_resume = { job: longId, steps: LONG, cancelled_at_step: cancelStep, first_step_after_resume: reSteps[0],
    final_loss: resumedJob.progress?.loss, attempts: resumedJob.attempts };
  // ---- the other kinds from the form ------------------------------------------
  const layers = (await apiJson(`checkpoints/${base.id}`)).summary.config.num_layers;
  // Submits the form as it stands and follows the job to its end.
  const runJob = async (what, timeout = 180_000) => {
    await clearMsg();
    await tid('job-submit').click();
    log(await okMsg());
    const r = await followJob(timeout);
    const j = await apiJson(`jobs/${r.id}`);
    check(r.state === 'succeeded' && j.state === 'succeeded', `${what} job ${r.id.slice(0, 8)}: ${r.state}${j.error ? ` (${j.error})` : ''}`);
    return j;
  };
  // The checkpoint list's layers cell of checkpoint `id` once it is shown.
  const layersOf = async (id) => {
    await page.waitForFunction((id) => /layers/.test(document.querySelector(`[data-testid=checkpoint-layers-${id}]`)?.textContent || ''),
      id, { timeout: 30_000 });
    return tid(`checkpoint-layers-${id}`).innerText();
  };

  // a dense fine-tune: the "instruct" model of the graft, the second expert of the MoErge
  await tid('job-kind').selectOption('train');
  await tid('job-model').selectOption(base.id);
  await tid('job-stage').selectOption('dense');
  await tid('job-steps').fill('3');
  await tid('job-seq_len').fill('32');
  await tid('job-batch').fill('4');
  await tid('job-data-0-upload').selectOption(corpusUp.id);
  await tid('job-data-0-name').fill('hu');
  const ft = await runJob('dense fine-tune (train, stage dense, 3 steps)');
  check(await layersOf(ft.output_checkpoint) === `${layers} layers · dense`, `the fine-tuned checkpoint is listed as ${layers} dense layers`);

  // MoErge: an invalid top-k first (the server's 422 next to the field), then a valid one
  await tid('job-kind').selectOption('moerge');
  await tid('job-form-moerge').waitFor();
  await tid(`job-models-${base.id}`).check();
  await tid(`job-models-${ft.output_checkpoint}`).check();
  await tid('job-top_k').fill('3');
  const jobsBefore = (await apiJson('jobs')).length;
  await tid('job-submit').click();
  await tid('job-error-top_k').waitFor({ timeout: 30_000 });
  const fieldErr = await tid('job-error-top_k').innerText();
  check(/3: expected 1 to 2 \(the experts: one per model\)/.test(fieldErr), `top_k 3 for 2 models: the server's message is shown next to top-k: "${fieldErr}"`);
  check((await apiJson('jobs')).length === jobsBefore, '... and no job was created');
  await tid('job-top_k').fill('1');
  const mo = await runJob('moerge (stories260K + fine-tune, top-k 1)');
  check(await tid('job-error-top_k').count() === 0, 'the field error is gone after a valid submission');
  const moLayers = await layersOf(mo.output_checkpoint);
  const moCkpt = await apiJson(`checkpoints/${mo.output_checkpoint}`);
  check(moLayers === `${layers} layers · 2 experts` && /moe/.test(moCkpt.architecture),
    `the MoErged checkpoint is listed as "${moLayers}" (${moCkpt.architecture})`);

  // graft: instruct − base onto the upcycled MoE
  await tid('job-kind').selectOption('graft');
  await tid('job-target').selectOption(upJob.output_checkpoint);
  await tid('job-base').selectOption(base.id);
  await tid('job-instruct').selectOption(ft.output_checkpoint);
  const gr = await runJob('graft (upcycled MoE + fine-tune − stories260K)');
  const grLayers = await layersOf(gr.output_checkpoint);
  check(grLayers === `${layers} layers · 2 experts`, `the grafted checkpoint is listed as "${grLayers}"`);

  // eval: perplexity of the trained MoE on the hu text
  await tid('job-kind').selectOption('eval');
  await tid('job-model').selectOption(trJob.output_checkpoint);
  await tid('job-data-0-upload').selectOption(corpusUp.id);
  await tid('job-data-0-name').fill('hu');
  await tid('job-window').fill('64');
  await tid('job-stride').fill('64');
  await tid('job-max_tokens').fill('2000');
  const ev = await runJob('eval (trained MoE on hu)');
  await tid('eval-ppl-hu').waitFor({ timeout: 30_000 });
  const shownPpl = await tid('eval-ppl-hu').innerText();
  const pagePpl = Number(await tid('eval-ppl-hu').getAttribute('data-value'));
  const evResult = await apiJson(`jobs/${ev.id}/artifacts/result.json`);
  const apiPpl = evResult.datasets.find((d) => d.name === 'hu')?.ppl;
  check(Number.isFinite(pagePpl) && pagePpl > 1 && Math.abs(pagePpl - apiPpl) <= 1e-12 * apiPpl && shownPpl === apiPpl.toFixed(4),
    `eval: the page shows perplexity ${shownPpl} on hu (${evResult.datasets[0].tokens} tokens), result.json says ${apiPpl}`);
  results.more_kinds = { layers, dense_finetune: ft.output_checkpoint, moerge: { job: mo.id, output: mo.output_checkpoint, listed: moLayers },
    graft: { job: gr.id, output: gr.output_checkpoint, listed: grLayers }, invalid_top_k_message: fieldErr,
    eval: { job: ev.id, model: trJob.output_checkpoint, tokens: evResult.datasets[0].tokens, ppl: apiPpl, shown: shownPpl } };
  check(pageErrors.length === 0, `no page errors${pageErrors.length ? `: ${pageErrors.join(' | ')}` : ''}`);
} catch (e) {
  failures++;
  console.log(`FAIL ${e.stack || e}`);
  await page.screenshot({ path: path.join(out, 'failure.png'), fullPage: true }).catch(() => {});
} finally {
  await browser.close();
}
results.total_ms = Date.now() - t0;
fs.writeFileSync(path.join(out, 'results.json'), JSON.stringify(results, null, 2));
console.log(JSON.stringify(results, null, 2));
console.log(failures ? `${failures} check(s) failed` : 'all checks passed');
process.exit(failures ? 1 : 0);
