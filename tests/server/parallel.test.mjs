// `vesper serve` split across 2 processes by mpirun (-tp 2 and -pp 2, 1 thread a rank): greedy
// completions and chat completions, streamed or not and concurrent, equal one process's
// `vesper generate`, also while other streams are cut mid-way; so do the 64 prompts of 48
// tokens, streamed at once, log-probabilities included. Faults end the job within bounded
// time with an answer to every request in flight: a follower killed mid-stream (mpirun reports
// the rank; a 503), a follower that hangs (SIGSTOP: after VESPER_DIST_TIMEOUT, rank 0 naming the
// wait; a 500). SIGTERM to mpirun drains until just before mpirun's SIGKILL (a 503 for the rest);
// SIGTERM to rank 0 drains whole, then every rank stops. Skipped where vesper was built without
// Open MPI (VESPER_MPIEXEC unset).
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync, mkdtempSync } from 'node:fs';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import os from 'node:os';
import path from 'node:path';
import { startServer, storiesLong, postJson, readSse, generateJson, waitForRequests, vesper,
  repoRoot } from './server_harness.mjs';

const mpiexec = process.env.VESPER_MPIEXEC;
const skip = mpiexec ? false : 'vesper was built without Open MPI';

// mpirun -n 2 vesper serve ... on a free port (1 thread a rank); resolves once rank 0 listens.
function startJob(split, env = {}) {
  const launcher = [mpiexec, '--allow-run-as-root', '--oversubscribe', '--bind-to', 'none',
    '--mca', 'btl_vader_single_copy_mechanism', 'none',
    ...Object.keys(env).flatMap((k) => ['-x', k]), '-n', '2'];
  return startServer(split, storiesLong, { launcher, env, threads: 1 });
}

// The pid of the job's rank `rank` (a child of mpirun whose environment names it).
function rankPid(job, rank) {
  const children = readFileSync(`/proc/${job.proc.pid}/task/${job.proc.pid}/children`, 'utf8')
    .trim().split(/\s+/).map(Number);
  for (const pid of children) {
    const env = readFileSync(`/proc/${pid}/environ`, 'utf8');
    if (env.split('\0').includes(`OMPI_COMM_WORLD_RANK=${rank}`)) return pid;
  }
  throw new Error('no rank ' + rank + ' among ' + children);
}

// A stream long enough to outlast the test's faults, once its first chunk has come.
async function startLongStream(job) {
  const res = await fetch(job.url + '/v1/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 1900, temperature: 0,
      ignore_eos: true, stream: true }),
  });
  assert.equal(res.status, 200);
  const reader = res.body.getReader();
  await reader.read();
  return reader;
}

async function streamText(url, body) {
  const res = await fetch(url, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ ...body, stream: true }),
  });
  assert.equal(res.status, 200);
  const { events, done } = await readSse(res);
  assert.ok(done);
  return events.map((e) => e.choices[0]?.text ?? e.choices[0]?.delta?.content ?? '').join('');
}

// The proof set, as tests/integration/parallel_cli_test.cpp makes it: 64 prompts of 48
// tokens from the held-out text (token ids, so that both sides read the same 48), greedy, 16
// tokens each, with the top 2 log-probabilities; and one process's `vesper generate` of them.
let heldOutRun;
function heldOutPrompts() {
  heldOutRun ??= (async () => {
    const run = promisify(execFile);
    const dir = mkdtempSync(path.join(os.tmpdir(), 'vesper-parallel-'));
    const words = readFileSync(path.join(repoRoot, '..', 'shared', 'data', 'tinystories-heldout.txt'),
      'utf8').split(/\s+/).filter((w) => w.length > 0);
    const texts = path.join(dir, 'texts.txt');
    writeFileSync(texts, Array.from({ length: 64 }, (_, p) => words.slice(p * 200, p * 200 + 40)
      .join(' ')).join('\n') + '\n');
    const generate = async (file) => (await run(vesper, ['generate', storiesLong, '--prompts-file',
      file, '--json', '-t', '1'], { cwd: repoRoot, maxBuffer: 64 << 20 })).stdout.trim().split('\n')
      .map((line) => JSON.parse(line));
    const ids = (await generate(texts)).map((j) => j.prompt_token_ids.slice(0, 48));
    assert.ok(ids.every((p) => p.length === 48));
    const jsonl = path.join(dir, 'prompts.jsonl');
    writeFileSync(jsonl, ids.map((p) => JSON.stringify({ prompt_token_ids: p, max_tokens: 16,
      temperature: 0, ignore_eos: true, logprobs: 2 })).join('\n') + '\n');
    return { prompts: ids, expected: await generate(jsonl) };
  })();
  return heldOutRun;
}

// A streamed completion's text and per-token log-probabilities.
async function streamWithLogprobs(url, body) {
  const res = await fetch(url + '/v1/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ ...body, stream: true }),
  });
  assert.equal(res.status, 200);
  const { events, done } = await readSse(res);
  assert.ok(done);
  let text = '';
  const logprobs = [];
  for (const e of events) {
    text += e.choices[0]?.text ?? '';
    logprobs.push(...(e.choices[0]?.logprobs?.token_logprobs ?? []));
  }
  return { text, logprobs };
}

const prompts = ['Once upon a time', 'Lily had a red ball.', 'The dog ran to the park and',
  'Tom and Sue were friends.'];

for (const split of [['-tp', '2'], ['-pp', '2']]) {
  describe(`serve ${split.join(' ')}`, { skip }, () => {
    let job;
    before(async () => { job = await startJob(split); });
    after(async () => {
      if (job && job.proc.exitCode === null) job.proc.kill('SIGTERM');
      await job?.exited;
    });

    test('greedy completions, streamed, plain and concurrent, equal one process', async () => {
      const expected = await Promise.all(prompts.map((p) => generateJson(p, 40)));
      const plain = await Promise.all(prompts.map((prompt) => postJson(job.url + '/v1/completions',
        { prompt, max_tokens: 40, temperature: 0 })));
      const streamed = await Promise.all(prompts.map((prompt) => streamText(
        job.url + '/v1/completions', { prompt, max_tokens: 40, temperature: 0 })));
      for (let i = 0; i < prompts.length; ++i) {
        assert.equal(plain[i].status, 200, plain[i].text);
        assert.equal(plain[i].json.choices[0].text, expected[i].text, prompts[i]);
        assert.equal(streamed[i], expected[i].text, prompts[i]);
      }
    });

    // Under -pp the aborted streams' sequences may be in the plan still in flight (two are, on
    // disjoint sequences): the runner must skip them, and the others' outputs stay one process's.
    test('streams cut mid-way leave the other requests their outputs', async () => {
      const expected = await Promise.all(prompts.map((p) => generateJson(p, 40)));
      const cut = await Promise.all([0, 1, 2].map(() => startLongStream(job)));
      const plain = Promise.all(prompts.map((prompt) => postJson(job.url + '/v1/completions',
        { prompt, max_tokens: 40, temperature: 0 })));
      for (const reader of cut) await reader.cancel();
      const answers = await plain;
      for (let i = 0; i < prompts.length; ++i) {
        assert.equal(answers[i].status, 200, answers[i].text);
        assert.equal(answers[i].json.choices[0].text, expected[i].text, prompts[i]);
      }
    });

    test('64 prompts of 48 tokens, streamed at once, equal one process\'s generate', async () => {
      const { prompts: ids, expected } = await heldOutPrompts();
      const streamed = await Promise.all(ids.map((prompt) => streamWithLogprobs(job.url,
        { prompt, max_tokens: 16, temperature: 0, ignore_eos: true, logprobs: 2 })));
      for (let i = 0; i < ids.length; ++i) {
        assert.equal(streamed[i].text, expected[i].text, `prompt ${i}`);
        const want = expected[i].token_ids.map((t, k) => expected[i].logprobs[k][String(t)]);
        assert.equal(streamed[i].logprobs.length, want.length, `prompt ${i}`);
        for (let k = 0; k < want.length; ++k) {
          assert.ok(Math.abs(streamed[i].logprobs[k] - want[k]) <= 1e-5 * Math.max(1, Math.abs(want[k])),
            `prompt ${i} token ${k}: ${streamed[i].logprobs[k]} vs ${want[k]}`);
        }
      }
    });

    test('streamed chat completions answer', async () => {
      const text = await streamText(job.url + '/v1/chat/completions', {
        messages: [{ role: 'user', content: 'Tell me a story' }], max_tokens: 24, temperature: 0,
      });
      assert.ok(text.length > 0);
    });
  });
}

// Work that outlasts the faults below: a stream and a plain request of `n` sampled choices of
// 1900 tokens each (n 8: about 2 s on 2 ranks of 1 thread, n 32: about 10 s, both requests
// together twice that), started once the
// stream's first chunk came. `stream` resolves to the stream's whole text and `plain` to the
// plain request's status and body; neither rejects when the connection is cut.
async function startLoad(job, n) {
  const body = { prompt: 'Once upon a time', max_tokens: 1900, temperature: 1, seed: 7, n,
    ignore_eos: true };
  const res = await fetch(job.url + '/v1/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ ...body, stream: true }),
  });
  assert.equal(res.status, 200);
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let text = decoder.decode((await reader.read()).value ?? new Uint8Array());
  const stream = (async () => {
    try {
      for (let r = await reader.read(); !r.done; r = await reader.read()) text += decoder.decode(r.value);
    } catch { /* cut */ }
    return text;
  })();
  const plain = postJson(job.url + '/v1/completions', body).catch((e) => ({ status: 0, text: String(e) }));
  await waitForRequests(job.url, 2 * n);  // both requests' sequences, running or waiting
  return { stream, plain };
}

// The stream's last event before [DONE], parsed.
function lastEvent(streamText) {
  const events = streamText.split('\n\n').map((e) => e.trim()).filter((e) => e.startsWith('data: '))
    .map((e) => e.slice(6));
  assert.equal(events.at(-1), '[DONE]', 'the stream ended without [DONE]:\n' + streamText.slice(-500));
  return JSON.parse(events.at(-2));
}

// Resolves with the job's exit within `seconds`, or rejects with its logs.
function exitWithin(job, seconds, what) {
  const deadline = new Promise((_, reject) => setTimeout(() => reject(new Error(
    `the job did not end within ${seconds} s of ${what}:\n` + job.logs)), seconds * 1000).unref());
  return Promise.race([job.exited, deadline]);
}

describe('faults and shutdown', { skip }, () => {
  // mpirun ends the job in its kill sequence (SIGCONT, SIGTERM 1 s later, SIGKILL 1 s after
  // that); rank 0, whose engine waits for the dead rank for ever, answers its clients just
  // before the SIGKILL.
  test('a follower killed mid-stream ends the job: no hang, mpirun names the rank, a 503 to each request', async () => {
    const job = await startJob(['-tp', '2']);
    const { stream, plain } = await startLoad(job, 8);
    process.kill(rankPid(job, 1), 'SIGKILL');
    const { code, signal } = await exitWithin(job, 60, 'a rank dying');
    assert.ok(code !== 0 || signal !== null, `exit ${code} ${signal}`);
    assert.match(job.logs, /rank 1 .*(exited on signal 9|Killed)|process rank 1/s);
    const error = lastEvent(await stream).error;
    assert.equal(error?.type, 'service_unavailable', JSON.stringify(error));
    assert.match(error.message, /mpirun ends every rank 1\.0 s after their SIGTERM \(a rank died/);
    const answer = await plain;
    assert.equal(answer.status, 503, answer.text);
    assert.equal(answer.json.error.type, 'service_unavailable');
  });

  test('a follower that stops answering (SIGSTOP) ends the job after VESPER_DIST_TIMEOUT, a 500 naming the wait to each request', async () => {
    const job = await startJob(['-pp', '2'], { VESPER_DIST_TIMEOUT: '3' });
    const { stream, plain } = await startLoad(job, 8);
    const follower = rankPid(job, 1);
    process.kill(follower, 'SIGSTOP');
    try {
      await exitWithin(job, 60, 'a rank hanging');
    } finally {
      try { process.kill(follower, 'SIGKILL'); } catch { /* gone */ }
    }
    assert.match(job.logs, /rank 0: MPI_\w+ has waited 3\.0+ s for the other ranks: one of them is hung/);
    const error = lastEvent(await stream).error;
    assert.equal(error?.type, 'server_error', JSON.stringify(error));
    assert.match(error.message, /^the parallel job failed and is ending: MPI_\w+ has waited 3\.0+ s/);
    const answer = await plain;
    assert.equal(answer.status, 500, answer.text);
    assert.match(answer.json.error.message, /has waited 3\.0+ s/);
  });

  // SIGTERM to mpirun starts the same kill sequence: the drain has the 1 s between its SIGTERM
  // and SIGKILL, and what it cannot finish in that time gets a 503.
  test('SIGTERM to mpirun: rank 0 drains until just before mpirun\'s SIGKILL, then a 503 to what is left', async () => {
    const job = await startJob(['-pp', '2']);
    const { stream, plain } = await startLoad(job, 32);
    job.proc.kill('SIGTERM');
    await exitWithin(job, 60, 'SIGTERM to mpirun');
    assert.match(job.logs, /finishing in-flight requests \(up to 0\.\d s: the launcher ends the process then/);
    const error = lastEvent(await stream).error;
    assert.equal(error?.type, 'service_unavailable', JSON.stringify(error));
    const answer = await plain;
    assert.equal(answer.status, 503, answer.text);
  });

  // SIGTERM to rank 0 itself: no kill sequence, so the drain has --shutdown-timeout; rank 0
  // finishes its requests, then stops the other ranks, and the job ends cleanly.
  test('SIGTERM to rank 0 drains its requests whole, then every rank stops', async () => {
    // (a generous drain: under CI's load, ranks that poll for each other's messages slow down
    // many times over)
    const job = await startJob(['-pp', '2', '--shutdown-timeout', '300']);
    const { stream, plain } = await startLoad(job, 4);
    process.kill(rankPid(job, 0), 'SIGTERM');
    const { code } = await exitWithin(job, 300, 'SIGTERM to rank 0');
    assert.equal(code, 0, job.logs);
    assert.match(job.logs, /finishing in-flight requests \(up to 300 s\)/);
    const last = lastEvent(await stream);
    assert.ok(last.choices.every((c) => c.finish_reason === 'length'), JSON.stringify(last));
    const answer = await plain;
    assert.equal(answer.status, 200, answer.text);
    assert.equal(answer.json.usage.completion_tokens, 4 * 1900);
  });
});
