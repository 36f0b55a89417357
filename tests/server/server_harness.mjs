// Starts `vesper serve` on a free loopback port and stops it; small HTTP helpers for the tests.
import { spawn, execFile } from 'node:child_process';
import { promisify } from 'node:util';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const execFileAsync = promisify(execFile);

const here = path.dirname(fileURLToPath(import.meta.url));
export const repoRoot = path.resolve(here, '..', '..');
export const vesper = process.env.VESPER_BINARY || path.join(repoRoot, 'build', 'bin', 'vesper');
export const storiesLong = path.join(repoRoot, '..', 'shared', 'models', 'stories260K-f32.gguf');

// Starts a server; resolves to {url, proc, logs, exited, stop()} once it listens. `launcher`
// (a command and its arguments, e.g. mpirun's) runs vesper; `env` adds to the environment.
export function startServer(args = [], model = storiesLong, { launcher = [], env = {}, threads = 2 } = {}) {
  return new Promise((resolve, reject) => {
    const command = [...launcher, vesper, 'serve', model, '--port', '0', '--threads', String(threads), ...args];
    const proc = spawn(command[0], command.slice(1), {
      cwd: repoRoot,
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, ...env },
    });
    let logs = '';
    const timer = setTimeout(() => reject(new Error('server did not start:\n' + logs)), 60000);
    const onData = (d) => {
      logs += d.toString();
      const m = logs.match(/on http:\/\/([0-9.]+):(\d+)/);
      if (m && !proc.started) {
        proc.started = true;
        clearTimeout(timer);
        const server = {
          url: `http://${m[1]}:${m[2]}`,
          proc,
          get logs() { return logs; },
          exited: new Promise((r) => proc.on('exit', (code, signal) => r({ code, signal }))),
          async stop() {
            if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGTERM');
            return server.exited;
          },
        };
        resolve(server);
      }
    };
    proc.stdout.on('data', onData);
    proc.stderr.on('data', onData);
    proc.on('exit', (code) => {
      if (!proc.started) {
        clearTimeout(timer);
        reject(new Error(`server exited with ${code}:\n${logs}`));
      }
    });
  });
}

export async function postJson(url, body, headers = {}) {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, json, text, headers: res.headers };
}

// Reads an SSE response to the end; returns the parsed events (without [DONE]) and whether
// [DONE] came.
export async function readSse(res) {
  const decoder = new TextDecoder();
  let buffer = '';
  const events = [];
  let done = false;
  for await (const chunk of res.body) {
    buffer += decoder.decode(chunk, { stream: true });
    let at;
    while ((at = buffer.indexOf('\n\n')) >= 0) {
      const event = buffer.slice(0, at);
      buffer = buffer.slice(at + 2);
      for (const line of event.split('\n')) {
        if (!line.startsWith('data: ')) continue;
        const data = line.slice(6);
        if (data === '[DONE]') done = true;
        else events.push(JSON.parse(data));
      }
    }
  }
  return { events, done };
}

export async function metrics(url) {
  const res = await fetch(url + '/metrics');
  const text = await res.text();
  const values = {};
  for (const line of text.split('\n')) {
    if (line.startsWith('#') || !line.trim()) continue;
    const m = line.match(/^([a-z_:]+)(\{[^}]*\})? ([0-9.eE+-]+)$/);
    if (m && !m[2]?.includes('le=')) values[m[1] + (m[2] && m[2].includes('finished_reason') ? m[2] : '')] = Number(m[3]);
  }
  return { text, values };
}

// Resolves once `n` requests are in the engine (running or waiting, from /metrics): a test that
// signals the server must not race its own requests there (a fixed pause is too short under TSan,
// and a request that arrives after SIGTERM is a 503). Fails after 30 s.
export async function waitForRequests(url, n) {
  for (const t0 = Date.now(); ; await new Promise((r) => setTimeout(r, 20))) {
    const { values } = await metrics(url);
    if (values['vesper:num_requests_running'] + values['vesper:num_requests_waiting'] >= n) return;
    if (Date.now() - t0 > 30000) throw new Error(`${n} requests never reached the engine`);
  }
}

// Greedy ids and text from `vesper generate` for the same model and prompt.
// Asynchronous on purpose: a synchronous child (execFileSync) freezes node's event loop and with
// it fetch's timers, so a kept-alive connection fetch would have closed after 4 idle seconds stays
// in its pool, the server closes it at 5 s (--timeout-keep-alive), and the next request on it
// fails with "fetch failed" (seen under TSan, where `vesper generate` takes 1.5 s).
export async function generateJson(prompt, maxTokens, model = storiesLong) {
  const { stdout } = await execFileAsync(vesper, ['generate', model, '--prompt', prompt,
    '--max-tokens', String(maxTokens), '--temperature', '0', '--json'], { cwd: repoRoot });
  return JSON.parse(stdout.trim().split('\n')[0]);
}
