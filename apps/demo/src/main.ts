/**
 * The page: find WebGPU, create the backend once (the adapter is injected, exactly as a
 * library user would), run the demo on submit and render the numbers. The result also lands
 * on `window.__crispResult` and in `<pre id="result">` so a headless browser can read it.
 *
 * URL parameters mirror the form (see parseConfig); `?autorun=1` runs once on load.
 */
import { CrispError, type DType } from '@crisp/core';
import { createWebGpuBackend, type WebGpuBackend } from '@crisp/kernels-webgpu';
import { PROFILE_NAMES } from '@crisp/synth';
import { cpuAdapterName, slowRunWarning } from './adapter-kind.js';
import { type DemoConfig, type DemoResult, type DemoSamples, type HeadResult, PRESET_NAMES, parseConfig, resolveDType, runDemo } from './run-demo.js';

export interface DemoFailure {
  readonly ok: false;
  /** CrispError code, or 'NO_WEBGPU' / 'ERROR' */
  readonly code: string;
  readonly message: string;
}

export interface AdapterReport {
  readonly vendor: string;
  readonly architecture: string;
  readonly description: string;
  readonly features: readonly string[];
  readonly shaderF16: boolean;
  readonly subgroups: boolean;
  readonly attentionKernel: string;
  /** the CPU implementation behind the adapter (e.g. 'SwiftShader'), null for a hardware GPU */
  readonly cpuAdapter: string | null;
}

declare global {
  interface Window {
    __crispAdapter?: AdapterReport | DemoFailure;
    __crispResult?: DemoResult | DemoFailure;
    __crispSamples?: DemoSamples;
  }
}

const $ = <T extends HTMLElement>(id: string): T => {
  const el = document.getElementById(id);
  if (!el) throw new Error(`the page lacks #${id}`);
  return el as T;
};

const form = $<HTMLFormElement>('config');
const runButton = $<HTMLButtonElement>('run');
const progressLine = $<HTMLParagraphElement>('progress');
const adapterLine = $<HTMLParagraphElement>('adapter');
const cpuBanner = $<HTMLDivElement>('cpu-banner');
const sizeWarning = $<HTMLParagraphElement>('size-warning');

function escapeHtml(s: string): string {
  return s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function fmt(x: number | null, digits = 3): string {
  if (x === null || Number.isNaN(x)) return '–';
  if (x !== 0 && (Math.abs(x) < 1e-3 || Math.abs(x) >= 1e6)) return x.toExponential(2);
  return x.toFixed(digits);
}

const pct = (x: number): string => `${(100 * x).toFixed(1)}%`;
const tflops = (x: number): string => (x < 0.1 ? x.toFixed(4) : x.toFixed(2));
const ms = (x: number): string => `${x < 10 ? x.toFixed(2) : x.toFixed(1)} ms`;

function setProgress(message: string, error = false): void {
  progressLine.textContent = message;
  progressLine.classList.toggle('error', error);
}

function failure(e: unknown): DemoFailure {
  if (e instanceof CrispError) return { ok: false, code: e.code, message: e.message };
  return { ok: false, code: 'ERROR', message: e instanceof Error ? e.message : String(e) };
}

// ---------------------------------------------------------------- the form

function fillForm(cfg: DemoConfig): void {
  const profile = form.elements.namedItem('profile') as HTMLSelectElement;
  const preset = form.elements.namedItem('preset') as HTMLSelectElement;
  if (profile.options.length === 0) for (const p of PROFILE_NAMES) profile.add(new Option(p, p));
  if (preset.options.length === 0) for (const p of PRESET_NAMES) preset.add(new Option(p, p));
  for (const [name, value] of Object.entries(cfg)) {
    const el = form.elements.namedItem(name) as HTMLInputElement | HTMLSelectElement | null;
    if (!el) continue;
    if (el instanceof HTMLInputElement && el.type === 'checkbox') el.checked = Boolean(value);
    else el.value = String(value);
  }
}

function formParams(): URLSearchParams {
  const p = new URLSearchParams();
  for (const el of Array.from(form.elements)) {
    if (!(el instanceof HTMLInputElement || el instanceof HTMLSelectElement) || !el.name) continue;
    if (el instanceof HTMLInputElement && el.type === 'checkbox') p.set(el.name, el.checked ? '1' : '0');
    else p.set(el.name, el.value);
  }
  return p;
}

// ---------------------------------------------------------------- rendering

function renderAdapter(a: AdapterReport, backend: WebGpuBackend): void {
  const flag = (on: boolean, name: string) => `<span class="${on ? 'yes' : 'no'}">${name}: ${on ? 'yes' : 'no'}</span>`;
  const l = backend.gpu.limits;
  adapterLine.innerHTML = [
    `<strong>${escapeHtml(a.vendor || 'unknown vendor')}</strong> ${escapeHtml(a.architecture)} ${escapeHtml(a.description)}`,
    `${flag(a.shaderF16, 'shader-f16')} · ${flag(a.subgroups, 'subgroups')} · attention kernel <code>${escapeHtml(a.attentionKernel)}</code>`,
    `max storage binding ${(l.maxStorageBufferBindingSize / 2 ** 20).toFixed(0)} MiB · workgroup memory ${(l.maxComputeWorkgroupStorageSize / 1024).toFixed(0)} KiB · measured length gate ${backend.sparseCrossoverFor('f32', 64)} keys in f32, ${backend.sparseCrossoverFor('f16', 64)} in f16`,
    `<span class="features">features: ${a.features.map((f) => `<code>${escapeHtml(f)}</code>`).join('')}</span>`,
  ].join('<br>');
}

function renderResult(r: DemoResult): void {
  const c = r.config;
  const rows: [string, string][] = [
    ['scenario', `${c.profile}, n = ${c.n}, H = ${c.heads}, H_kv = ${c.kvHeads}, d = ${c.headDim}, ${c.dtype}, seed ${c.seed}`],
    ['policy', r.denseReason ? `${r.policy} (dense plan: ${r.denseReason})` : r.policy],
    ['length gate (dense below)', `${r.sparseCrossover} keys, ${c.lengthGate ? 'applied' : 'off'}`],
    ['density (selected causal blocks)', pct(r.overallDensity)],
    ['plan (proxy stats, routing, selection)', ms(r.planMs)],
    ['sparse attention', ms(r.attentionMs)],
    ['sparse total (plan + attention)', ms(r.sparseMs)],
    ['dense attention, same device', ms(r.denseMs)],
    ['speed-up vs dense', `${r.speedup.toFixed(2)}x${c.warmup ? '' : ' (no warm-up: the times include shader compiles)'}`],
    ['attention kernel', r.attentionKernel],
    ['proxy statistics kernel', r.statisticsKernel],
    ['achieved TFLOP/s: dense, sparse (computed blocks)', `${tflops(r.denseTflops)}, ${tflops(r.sparseTflops)}`],
    ['kernel error vs float64, same mask', fmt(r.kernelError)],
    ['dense kernel error vs float64', fmt(r.denseKernelError)],
    ['output error vs float64 dense', fmt(r.outputError)],
    ['mass recall', pct(r.massRecall)],
    ['needle recall', `${pct(r.needleRecall.recall)} (${r.needleRecall.recalled} / ${r.needleRecall.total})`],
    ['checked rows', `${r.rows.length} (float64 in ${ms(r.referenceMs)})`],
  ];
  $('summary').innerHTML = rows.map(([k, v]) => `<tr><th>${escapeHtml(k)}</th><td>${escapeHtml(v)}</td></tr>`).join('');

  const scoreHead = r.scoreName && r.scoreName !== 'C_struct' ? `<th>${escapeHtml(r.scoreName)}</th>` : '';
  const head = `<tr><th>head</th><th class="text">kind</th><th>route</th><th>expected</th><th>C_struct</th>${scoreHead}<th>density</th><th>mass recall</th><th>kernel error</th><th>output error</th></tr>`;
  const body = r.heads
    .map((h) => {
      const score = scoreHead ? `<td>${fmt(h.routeScore)}</td>` : '';
      const bar = `<span class="bar" style="width:${(60 * h.density).toFixed(1)}px"></span>`;
      return `<tr><td>${h.head}</td><td class="text">${h.kind}</td><td class="route-${h.route}">${h.route.toUpperCase()}</td><td>${h.expectedRoute.toUpperCase()}</td><td>${fmt(h.cStruct)}</td>${score}<td>${bar}${pct(h.density)}</td><td>${pct(h.massRecall)}</td><td>${fmt(h.kernelError)}</td><td>${fmt(h.outputError)}</td></tr>`;
    })
    .join('');
  $('heads').innerHTML = head + body;
  renderCliff(r);
  $('result').textContent = JSON.stringify(r, null, 2);
  $('output').hidden = false;
}

const SVG_W = 250;
const SVG_H = 150;
const PAD = { left: 34, right: 8, top: 26, bottom: 20 };

/** One small log-axis plot per head: sorted p_v and p_s, dots on the selected blocks. */
function cliffSvg(h: HeadResult): string {
  const title = `head ${h.head} · ${h.route.toUpperCase()} · ${h.kind} · C_struct ${fmt(h.cStruct, 2)}`;
  if (!h.verticalMass || !h.slashMass) return '';
  const curves = [
    { mass: h.verticalMass, kept: new Set(h.verticalSelected), color: '#2457c5' },
    { mass: h.slashMass, kept: new Set(h.slashSelected), color: '#d97706' },
  ];
  const positive = curves.flatMap((c) => c.mass.filter((x) => x > 0));
  const lo = Math.max(-9, Math.floor(Math.log10(Math.min(...positive, 1))));
  const Nb = h.verticalMass.length;
  const x = (rank: number) => PAD.left + ((SVG_W - PAD.left - PAD.right) * rank) / Math.max(1, Nb - 1);
  const y = (m: number) => {
    const l = m > 0 ? Math.max(lo, Math.log10(m)) : lo;
    return PAD.top + ((SVG_H - PAD.top - PAD.bottom) * -l) / -lo;
  };
  const parts: string[] = [`<text x="4" y="12" font-weight="600">${escapeHtml(title)}</text>`];
  const step = Math.max(1, Math.ceil(-lo / 4));
  for (let e = 0; e >= lo; e -= step) {
    const yy = y(10 ** e).toFixed(1);
    parts.push(`<line x1="${PAD.left}" x2="${SVG_W - PAD.right}" y1="${yy}" y2="${yy}" stroke="#e3e6eb"/>`);
    parts.push(`<text x="${PAD.left - 3}" y="${yy}" text-anchor="end" dominant-baseline="middle" fill="#6b7585">1e${e}</text>`);
  }
  parts.push(`<text x="${SVG_W - PAD.right}" y="${SVG_H - 6}" text-anchor="end" fill="#6b7585">rank (of ${Nb} blocks)</text>`);
  for (const c of curves) {
    const order = c.mass.map((m, i) => [m, i] as const).sort((a, b) => b[0] - a[0] || a[1] - b[1]);
    const pts = order.map(([m], r) => `${x(r).toFixed(1)},${y(m).toFixed(1)}`).join(' ');
    parts.push(`<polyline points="${pts}" fill="none" stroke="${c.color}" stroke-width="1.5" opacity="${h.route === 'pe' ? 0.45 : 1}"/>`);
    order.forEach(([m, i], r) => {
      if (c.kept.has(i)) parts.push(`<circle cx="${x(r).toFixed(1)}" cy="${y(m).toFixed(1)}" r="2.3" fill="${c.color}"/>`);
    });
  }
  return `<svg class="cliff-head" width="${SVG_W}" height="${SVG_H}" viewBox="0 0 ${SVG_W} ${SVG_H}" role="img" aria-label="${escapeHtml(title)}">${parts.join('')}</svg>`;
}

function renderCliff(r: DemoResult): void {
  $('cliff').innerHTML = r.denseReason
    ? `<p class="note">dense plan (${escapeHtml(r.denseReason)}): no proxy statistics</p>`
    : r.heads.map(cliffSvg).join('');
}

// ---------------------------------------------------------------- wiring

async function init(): Promise<WebGpuBackend | undefined> {
  const gpu = navigator.gpu;
  if (!gpu) {
    const why = window.isSecureContext
      ? 'this browser exposes no WebGPU (navigator.gpu is undefined): use a recent Chrome or Edge, or enable WebGPU in its flags'
      : 'WebGPU needs a secure context: open the page over https or http://localhost';
    throw new CrispError('BACKEND_UNAVAILABLE', why);
  }
  const adapter = await gpu.requestAdapter({ powerPreference: 'high-performance' });
  if (!adapter) {
    throw new CrispError('BACKEND_UNAVAILABLE', 'WebGPU is present but no adapter was found (requestAdapter returned null): the GPU or its driver is blocked');
  }
  // The adapter is injected: the same backend code runs in Node with Dawn's adapter.
  const backend = await createWebGpuBackend({ adapter });
  const features = Array.from(adapter.features).sort();
  // adapter.info arrived in Chrome 127; older WebGPU browsers lack it.
  const info: Partial<GPUAdapterInfo> & { isFallbackAdapter?: boolean } = (adapter as { info?: GPUAdapterInfo }).info ?? {};
  const a: AdapterReport = {
    vendor: info.vendor ?? '',
    architecture: info.architecture ?? '',
    description: info.description ?? '',
    features,
    shaderF16: features.includes('shader-f16'),
    subgroups: features.includes('subgroups'),
    attentionKernel: backend.attentionKernel,
    cpuAdapter: cpuAdapterName({ vendor: info.vendor, architecture: info.architecture, description: info.description, isFallbackAdapter: info.isFallbackAdapter ?? (adapter as { isFallbackAdapter?: boolean }).isFallbackAdapter }),
  };
  window.__crispAdapter = a;
  renderAdapter(a, backend);
  if (a.cpuAdapter) {
    cpuBanner.innerHTML = `<strong>CPU adapter:</strong> WebGPU runs on ${escapeHtml(a.cpuAdapter)} here, which emulates a GPU on the CPU. The numbers are still checked against float64, but the times and the speed-up say nothing about a GPU, and large sizes take minutes.`;
    cpuBanner.hidden = false;
  }
  return backend;
}

async function main(): Promise<void> {
  const url = new URLSearchParams(location.search);
  let initial: DemoConfig;
  let badUrl = false;
  try {
    initial = parseConfig(url);
  } catch (e) {
    badUrl = true;
    window.__crispResult = failure(e);
    setProgress(`bad URL parameter: ${window.__crispResult.message}`, true);
    initial = parseConfig(new URLSearchParams());
  }
  fillForm(initial);

  let backend: WebGpuBackend | undefined;
  try {
    backend = await init();
  } catch (e) {
    const f = failure(e);
    window.__crispAdapter = f;
    adapterLine.textContent = `WebGPU is not available: ${f.message}`;
    adapterLine.classList.add('error');
    // A bad URL parameter stays the reported problem: it is the one the user can fix here.
    if (badUrl) return;
    window.__crispResult = { ...f, code: f.code === 'BACKEND_UNAVAILABLE' ? 'NO_WEBGPU' : f.code };
    setProgress('cannot run without WebGPU', true);
    return;
  }
  runButton.disabled = false;
  if (!badUrl) setProgress('ready');
  const cpu = window.__crispAdapter && 'cpuAdapter' in window.__crispAdapter ? window.__crispAdapter.cpuAdapter : null;
  const warnSize = (): void => {
    let text: string | null = null;
    try {
      text = slowRunWarning(cpu, parseConfig(formParams()));
    } catch {
      // a half-typed value: the run itself will say what is wrong
    }
    sizeWarning.textContent = text ?? '';
    sizeWarning.hidden = text === null;
  };
  form.addEventListener('input', warnSize);
  warnSize();

  const run = async (): Promise<void> => {
    runButton.disabled = true;
    try {
      const params = formParams();
      const cfg = parseConfig(params);
      history.replaceState(null, '', `?${params}`);
      const dtype: DType = resolveDType(cfg, window.__crispAdapter && 'features' in window.__crispAdapter ? window.__crispAdapter.features : []);
      const started = performance.now();
      const { result: r, samples } = await runDemo(backend!, cfg, dtype, (m) => setProgress(`${m} (${((performance.now() - started) / 1000).toFixed(1)} s)`));
      window.__crispSamples = samples;
      window.__crispResult = r;
      renderResult(r);
      setProgress(`done in ${((performance.now() - started) / 1000).toFixed(1)} s`);
    } catch (e) {
      const f = failure(e);
      window.__crispResult = f;
      setProgress(`error ${f.code}: ${f.message}`, true);
    } finally {
      runButton.disabled = false;
    }
  };
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    window.__crispResult = undefined;
    window.__crispSamples = undefined;
    void run();
  });
  if (url.get('autorun') === '1' && !badUrl) void run();
}

void main();
