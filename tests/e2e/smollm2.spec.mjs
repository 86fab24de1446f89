// Opt-in (E2E_SMOLLM2=path/to/SmolLM2-135M-Instruct.gguf): the studio on a
// real 135M model — load the GGUF, upcycle to 2 experts, ridge router on
// two small corpora, graft (base = instruct = the GGUF: a zero delta that
// still streams every tensor) — with browser timings for the note.
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';

const sha = (p) => crypto.createHash('sha256').update(fs.readFileSync(p)).digest('hex');

export async function run({ context, url, work, out, check, log, gguf }) {
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  const tid = (id) => page.getByTestId(id);
  const text = async (id, timeout) => { await tid(id).waitFor({ timeout }); return tid(id).innerText(); };
  const fail = page.locator('[role=alert]');
  const r = {};
  // wasm32 has 4 GiB: one tab holds the GGUF, the 0.86 GB upcycled MoE and
  // one more output, so the graft and the router run in two page loads.
  const loadAndUpcycle = async () => {
    await page.goto(url);
    let t = Date.now();
    await tid('model-files').setInputFiles(gguf);
    await page.getByText(/loaded .*gguf/).waitFor({ timeout: 300_000 });
    r.load_ms = Date.now() - t;
    await tid('tab-upcycle').click();
    await tid('upcycle-experts').fill('2');
    t = Date.now();
    await tid('upcycle-run').click();
    r.upcycle = await text('upcycle-ok', 600_000).catch(async (e) => { throw new Error(`${e}: ${await fail.allInnerTexts()}`); });
    r.upcycle_wall_ms = Date.now() - t;
  };
  await loadAndUpcycle();
  log(`SmolLM2 upcycle: ${r.upcycle}`);
  await tid('tab-download').click();
  const [dl] = await Promise.all([page.waitForEvent('download'), tid('dl-0-model.safetensors').click()]);
  const p = path.join(out, 'smollm2-upcycled.safetensors');
  await dl.saveAs(p);
  const cliFile = path.join(work, 'cli', 'smollm2-upcycled', 'model.safetensors');
  if (fs.existsSync(cliFile)) {
    r.upcycle_sha256_equal = sha(p) === sha(cliFile);
    check(r.upcycle_sha256_equal, 'SmolLM2 upcycle download sha256 == CLI');
  }
  fs.rmSync(p, { force: true });
  await tid('tab-graft').click();
  await tid('graft-target').selectOption('a0');
  await tid('graft-base').selectOption('i0');
  await tid('graft-instruct').selectOption('i0');
  let t = Date.now();
  await tid('graft-run').click();
  r.graft = await text('graft-ok', 600_000);
  r.graft_wall_ms = Date.now() - t;
  log(`SmolLM2 graft: ${r.graft}`);
  await loadAndUpcycle();
  await tid('tab-moerge').click();
  for (const [i, lang] of [[0, 'en'], [1, 'hu']]) {
    await tid(`domain-file-${i}`).setInputFiles(path.join(work, `small-${lang}.txt`));
    await tid(`domain-name-${i}`).fill(lang);
  }
  await tid('route-max-tokens').fill('128');
  await tid('route-ppl').uncheck();
  await tid('route-model').selectOption('a0');
  t = Date.now();
  await tid('route-run').click();
  r.route = await text('route-ok', 900_000).catch(async (e) => { throw new Error(`${e}: ${await fail.allInnerTexts()}`); });
  r.route_wall_ms = Date.now() - t;
  log(`SmolLM2 route: ${r.route}`);
  check(errors.length === 0, `SmolLM2: no page errors (${errors.slice(0, 2).join(' | ')})`);
  await page.close();
  return r;
}
