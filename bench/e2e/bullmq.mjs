// BullMQ peer of Jackdaw's end-to-end benchmark (bench/e2e/run.sh).
//
// One Node process is both producer and worker, as a small BullMQ
// deployment runs: the producer adds no-op jobs whose data holds the submit
// time; a Worker with concurrency C runs them (the processor does nothing)
// and removes them on completion, as beanstalkd's delete does. Closed loop
// (default): at most C jobs are in flight. Open loop (--rate R): one job is
// due every 1/R s and latency counts from the due time.
//
// Prints one JSON line in loadgen's format, plus client_rss_kb (this
// process's peak RSS). Node is single-threaded: nothing here is shared
// between threads.
import { Queue, Worker } from 'bullmq';
import { readFileSync } from 'node:fs';

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => {
    if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1]]);
    return acc;
  }, []),
);
const port = Number(args.port ?? 6379);
const jobs = Number(args.jobs ?? 20000);
const conns = Number(args.conns ?? 64);
const rate = Number(args.rate ?? 0);
const label = args.label ?? 'bullmq';
const timeoutS = Number(args.timeout ?? 300);

const connection = { host: '127.0.0.1', port, maxRetriesPerRequest: null };
const name = `bench-${process.pid}`;
const queue = new Queue(name, { connection });
await queue.obliterate({ force: true }).catch(() => {});

const lat = new Float64Array(jobs);
let nlat = 0;
let completed = 0;
let failed = 0;
let submitted = 0;
let inflight = 0;
const now = () => Number(process.hrtime.bigint()) / 1e6; // ms, monotonic

let finish;
const finished = new Promise((resolve) => (finish = resolve));

const worker = new Worker(name, async () => null, {
  connection,
  concurrency: conns,
  removeOnComplete: { count: 0 },
  removeOnFail: { count: 0 },
});
const record = (job, ok) => {
  lat[nlat++] = now() - job.data.t;
  if (ok) completed++;
  else failed++;
  inflight--;
  if (completed + failed >= jobs) finish();
  else if (rate === 0) pump();
};
worker.on('completed', (job) => record(job, true));
worker.on('failed', (job) => record(job, false));
worker.on('error', (e) => console.error('bullmq worker:', e.message));
await worker.waitUntilReady();

// Closed loop: keep C jobs in flight.
function pump() {
  while (inflight < conns && submitted < jobs) {
    inflight++;
    submitted++;
    queue.add('noop', { t: now(), n: submitted }).catch((e) => {
      console.error('bullmq add:', e.message);
      failed++;
      inflight--;
    });
  }
}

const t0 = now();
if (rate > 0) {
  // Open loop: submit whatever is due every millisecond.
  let due = t0;
  const step = 1000 / rate;
  const timer = setInterval(() => {
    const t = now();
    while (due <= t && submitted < jobs) {
      inflight++;
      submitted++;
      queue.add('noop', { t: due, n: submitted }).catch((e) => {
        console.error('bullmq add:', e.message);
        failed++;
      });
      due += step;
    }
    if (submitted >= jobs) clearInterval(timer);
  }, 1);
} else {
  pump();
}
const timer = setTimeout(() => {
  console.error(`bullmq: timed out after ${timeoutS} s`);
  finish();
}, timeoutS * 1000);
await finished;
clearTimeout(timer);
const secs = (now() - t0) / 1000;

const sorted = Array.from(lat.subarray(0, nlat)).sort((a, b) => a - b);
const pct = (p) => (sorted.length ? sorted[Math.round(p * (sorted.length - 1))] : 0);
let rssKb = 0;
try {
  rssKb = Number(/VmHWM:\s+(\d+)/.exec(readFileSync('/proc/self/status', 'utf8'))[1]);
} catch {
  rssKb = Math.round(process.memoryUsage().rss / 1024);
}
const out = {
  label,
  jobs,
  completed,
  failed,
  errors: 0,
  conns,
  rate,
  secs: Number(secs.toFixed(3)),
  jobs_per_s: Math.round(completed / secs),
  p50_ms: Number(pct(0.5).toFixed(3)),
  p90_ms: Number(pct(0.9).toFixed(3)),
  p99_ms: Number(pct(0.99).toFixed(3)),
  max_ms: Number(pct(1).toFixed(3)),
  client_rss_kb: rssKb,
};
console.log(JSON.stringify(out));
console.error(
  `${label}: ${completed}/${jobs} jobs in ${secs.toFixed(2)} s = ${out.jobs_per_s} jobs/s; ` +
    `p50 ${out.p50_ms.toFixed(2)} ms p99 ${out.p99_ms.toFixed(2)} ms`,
);
await worker.close(true);
await queue.obliterate({ force: true }).catch(() => {});
await queue.close();
process.exit(completed === jobs ? 0 : 1);
