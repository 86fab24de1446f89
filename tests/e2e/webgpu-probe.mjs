// Which chromium flags give a WebGPU adapter headless on this machine?
// Usage: node webgpu-probe.mjs   (prints one line per flag set)
import { launch } from './browser.mjs';
import { serve } from './server.mjs';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export const FLAG_SETS = {
  'none': [],
  'unsafe-webgpu': ['--enable-unsafe-webgpu'],
  'unsafe-webgpu+Vulkan': ['--enable-unsafe-webgpu', '--enable-features=Vulkan'],
  'unsafe-webgpu+Vulkan+angle-swiftshader': ['--enable-unsafe-webgpu', '--enable-features=Vulkan', '--use-angle=swiftshader'],
  'unsafe-webgpu+adapter-swiftshader': ['--enable-unsafe-webgpu', '--use-webgpu-adapter=swiftshader'],
  'full': ['--enable-unsafe-webgpu', '--enable-features=Vulkan', '--use-angle=swiftshader', '--use-webgpu-adapter=swiftshader', '--ignore-gpu-blocklist'],
  'full+WebGPU-feature': ['--enable-unsafe-webgpu', '--enable-features=Vulkan,WebGPU', '--use-angle=swiftshader', '--use-webgpu-adapter=swiftshader', '--ignore-gpu-blocklist'],
};

/** Returns a description of the adapter granted under `args`, or null. */
export async function probe(url, args) {
  const b = await launch(args);
  try {
    const page = await b.context.newPage();
    await page.goto(url);
    return await page.evaluate(async () => {
      if (!navigator.gpu) return { ok: false, why: 'no navigator.gpu' };
      try {
        const a = await navigator.gpu.requestAdapter();
        if (!a) return { ok: false, why: 'requestAdapter() returned null' };
        const i = a.info || {};
        return { ok: true, adapter: `${i.vendor} ${i.architecture} ${i.description}`.trim() };
      } catch (e) { return { ok: false, why: String(e) }; }
    });
  } finally { await b.close(); }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'probe-'));
  fs.writeFileSync(path.join(root, 'index.html'), '<!doctype html><title>probe</title>');
  const srv = await serve(root);
  for (const [name, args] of Object.entries(FLAG_SETS)) {
    const t0 = Date.now();
    const r = await probe(srv.url, args).catch((e) => ({ ok: false, why: String(e).split('\n')[0] }));
    console.log(`${name.padEnd(42)} ${r.ok ? 'ADAPTER ' + r.adapter : 'none: ' + r.why} (${Date.now() - t0} ms)`);
  }
  await srv.close();
}
