// Launching Debian's chromium with playwright-core (no browser download).
import { chromium } from 'playwright-core';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export const EXECUTABLE = process.env.CHROMIUM || '/usr/bin/chromium';

// Quiet, reproducible headless chromium (no network side traffic).
export const BASE_ARGS = [
  '--headless', '--no-sandbox', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync', '--disable-quic',
  '--disable-dev-shm-usage',
];

// WebGPU on software Vulkan (SwiftShader bundled with chromium) — see
// README.md in this folder for what each flag does and which sets were tried.
export const WEBGPU_ARGS = [
  '--enable-unsafe-webgpu', '--enable-features=Vulkan', '--use-angle=swiftshader',
  '--use-webgpu-adapter=swiftshader', '--ignore-gpu-blocklist',
];

/** Launches a persistent context with a fresh profile; returns { context, close }. */
export async function launch(extraArgs = WEBGPU_ARGS, opts = {}) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'moe-studio-chromium-'));
  const context = await chromium.launchPersistentContext(dir, {
    executablePath: EXECUTABLE,
    headless: true,
    args: [...BASE_ARGS, ...extraArgs],
    acceptDownloads: true,
    viewport: { width: 1280, height: 900 },
    ...opts,
  });
  return {
    context,
    close: async () => { await context.close(); fs.rmSync(dir, { recursive: true, force: true }); },
  };
}
