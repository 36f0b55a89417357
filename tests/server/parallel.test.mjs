// `vesper serve` split across 2 processes by mpirun (-tp 2 and -pp 2, 1 thread a rank): greedy
// completions and chat completions, streamed or not and concurrent, equal one process's
// `vesper generate`, also while other streams are cut mid-way; a follower rank killed mid-stream ends the job (mpirun reports the rank)
// within bounded time, with no hang; a follower that hangs (SIGSTOP) ends it after
// VESPER_DIST_TIMEOUT with rank 0 naming the wait; SIGTERM to mpirun lets rank 0 drain its
// streams, then every rank stops. Skipped where vesper was built without Open MPI (VESPER_MPIEXEC unset).
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { startServer, storiesLong, postJson, readSse, generateJson, waitForRequests } from './server_harness.mjs';

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

    test('streamed chat completions answer', async () => {
      const text = await streamText(job.url + '/v1/chat/completions', {
        messages: [{ role: 'user', content: 'Tell me a story' }], max_tokens: 24, temperature: 0,
      });
      assert.ok(text.length > 0);
    });
  });
}

describe('faults and shutdown', { skip }, () => {
  test('a follower killed mid-stream ends the job: no hang, mpirun names the rank', async () => {
    const job = await startJob(['-tp', '2']);
    const reader = await startLongStream(job);
    process.kill(rankPid(job, 1), 'SIGKILL');
    // The stream ends (cut short) and the whole job exits, within bounded time.
    const drained = (async () => { try { while (!(await reader.read()).done); } catch { /* cut */ } })();
    // (unref: a pending timer must not keep the test process alive once the job has ended)
    const deadline = new Promise((_, reject) => setTimeout(() => reject(new Error(
      'the job did not end within 60 s of a rank dying:\n' + job.logs)), 60000).unref());
    const { code, signal } = await Promise.race([job.exited, deadline]);
    await Promise.race([drained, deadline]);
    assert.ok(code !== 0 || signal !== null, `exit ${code} ${signal}`);
    assert.match(job.logs, /rank 1 .*(exited on signal 9|Killed)|process rank 1/s);
  });

  test('a follower that stops answering (SIGSTOP) ends the job after VESPER_DIST_TIMEOUT', async () => {
    const job = await startJob(['-pp', '2'], { VESPER_DIST_TIMEOUT: '3' });
    const reader = await startLongStream(job);
    const follower = rankPid(job, 1);
    process.kill(follower, 'SIGSTOP');
    const deadline = new Promise((_, reject) => setTimeout(() => reject(new Error(
      'the job did not end within 60 s of a rank hanging:\n' + job.logs)), 60000).unref());
    try {
      const drained = (async () => { try { while (!(await reader.read()).done); } catch { /* cut */ } })();
      await Promise.race([job.exited, deadline]);
      await Promise.race([drained, deadline]);
    } finally {
      try { process.kill(follower, 'SIGKILL'); } catch { /* gone */ }
    }
    assert.match(job.logs, /rank 0: MPI_\w+ has waited 3\.0+ s for the other ranks: one of them is hung/);
  });

  test('SIGTERM to mpirun drains rank 0\'s streams, then every rank stops', async () => {
    const job = await startJob(['-pp', '2']);
    const stream = streamText(job.url + '/v1/completions',
      { prompt: 'Once upon a time', max_tokens: 200, temperature: 0, ignore_eos: true });
    // The request must have reached the engine before the signal (a fixed pause raced under CI's
    // load, as it did in server.test.mjs): a request still in the listener's queue is refused.
    await waitForRequests(job.url, 1);
    job.proc.kill('SIGTERM');
    const text = await stream;  // finished with [DONE], not cut
    assert.ok(text.length > 0);
    await job.exited;
    assert.match(job.logs, /finishing in-flight requests/);
  });
});
