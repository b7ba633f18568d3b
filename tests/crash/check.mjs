// Verdict of a crash run (tests/crash/crash.sh): compares the jobs that were
// acknowledged with what the server returns after all restarts, and the
// side-effect file with each job's recorded history. Prints TAP lines
// numbered from FIRST and exits non-zero if any failed.
//
//   node check.mjs ACKED_FILE JOBS_DIR EFFECTS_FILE FIRST
//
// JOBS_DIR/<id>.json is GET /v1/jobs/<id>?wait=..., <id>.events.json its
// GET /v1/jobs/<id>/events. Each effect line is "<job id> <step> <wall ms>".
import { readFileSync, existsSync } from 'node:fs';

const [ackedFile, jobsDir, effectsFile, firstArg] = process.argv.slice(2);
let n = Number(firstArg ?? 1) - 1;
let failed = 0;
const tap = (ok, name) => {
  n++;
  if (!ok) failed++;
  console.log(`${ok ? 'ok' : 'not ok'} ${n} - ${name}`);
};
const readJson = (path) => {
  try {
    return existsSync(path) ? JSON.parse(readFileSync(path, 'utf8')) : null;
  } catch {
    return null;
  }
};

const acked = readFileSync(ackedFile, 'utf8').split('\n').filter(Boolean);
const effects = new Map(); // "id step" -> [ms...]
for (const line of readFileSync(effectsFile, 'utf8').split('\n')) {
  const [id, step, ms] = line.trim().split(/\s+/);
  if (!id || !step) continue;
  const k = `${id} ${step}`;
  if (!effects.has(k)) effects.set(k, []);
  effects.get(k).push(Number(ms));
}

const STEPS = ['a', 'b', 'c'];
let found = 0;
let terminal = 0;
let succeeded = 0;
let rerunRecorded = 0; // the bug we look for
let redispatched = 0; // at-least-once: ran again before its completion was recorded
let missingEffects = 0;
let noHistory = 0;
const examples = [];
const note = (s) => examples.length < 8 && examples.push(s);

for (const id of acked) {
  const job = readJson(`${jobsDir}/${id}.json`);
  if (!job || String(job.id) !== id) {
    note(`job ${id} not found: ${JSON.stringify(job)?.slice(0, 200)}`);
    continue;
  }
  found++;
  if (['succeeded', 'failed', 'cancelled'].includes(job.state)) terminal++;
  else note(`job ${id} is ${job.state}`);
  if (job.state === 'succeeded') succeeded++;
  else if (job.state !== undefined && examples.length < 8 && job.state !== 'running')
    note(`job ${id} ${job.state}: ${JSON.stringify(job.error)?.slice(0, 200)}`);

  const evs = readJson(`${jobsDir}/${id}.events.json`)?.events;
  if (!Array.isArray(evs)) {
    noHistory++;
    note(`job ${id}: no history`);
    continue;
  }
  // Which step each tag is: the dispatch's argv names it ("$1 <step> ...").
  const stepOfTag = new Map();
  const completeSeq = new Map();
  const completeMs = new Map();
  let fractional = true;
  for (const e of evs.sort((x, y) => x.seq - y.seq)) {
    if (e.kind === 'dispatch') {
      const argv = e.data?.args?.argv;
      const m = Array.isArray(argv) ? /\$1 (\w+) /.exec(String(argv[2])) : null;
      if (m) stepOfTag.set(e.tag, m[1]);
      if (completeSeq.has(e.tag)) {
        rerunRecorded++;
        note(`job ${id}: tag ${e.tag} dispatched again (seq ${e.seq}) after its completion (seq ${completeSeq.get(e.tag)})`);
      }
    } else if (e.kind === 'complete') {
      if (completeSeq.has(e.tag)) {
        rerunRecorded++;
        note(`job ${id}: tag ${e.tag} completed twice (seq ${completeSeq.get(e.tag)} and ${e.seq})`);
        continue;
      }
      completeSeq.set(e.tag, e.seq);
      const t = typeof e.time === 'string' ? Date.parse(e.time) : Number(e.time);
      if (typeof e.time === 'string' && !/\.\d/.test(e.time)) fractional = false;
      completeMs.set(e.tag, t);
    }
  }
  // A side effect written after the step's completion was recorded is a
  // re-run of a recorded step. The step writes before it exits, the host
  // records the completion after: the slack only absorbs clock rounding.
  const slack = fractional ? 5 : 1000;
  for (const [tag, step] of stepOfTag) {
    const times = effects.get(`${id} ${step}`) ?? [];
    if (times.length > 1) redispatched += times.length - 1;
    const done = completeMs.get(tag);
    if (done === undefined || Number.isNaN(done)) continue;
    const late = times.filter((t) => t > done + slack);
    if (late.length) {
      rerunRecorded += late.length;
      note(`job ${id} step ${step}: side effect at ${late[0]} after its completion was recorded at ${done}`);
    }
  }
  if (job.state === 'succeeded') {
    for (const s of STEPS) {
      if (!effects.has(`${id} ${s}`)) {
        missingEffects++;
        note(`job ${id} succeeded but step ${s} left no side effect`);
      }
    }
  }
}

const total = acked.length;
console.log(
  `# acknowledged ${total}, found ${found}, terminal ${terminal}, succeeded ${succeeded}, ` +
    `lost ${total - found}, recorded steps re-run ${rerunRecorded}, ` +
    `steps re-run before their completion was recorded (allowed) ${redispatched}`,
);
for (const e of examples) console.log(`# ${e}`);
tap(total > 0, `jobs were acknowledged under load (${total})`);
tap(found === total, `every acknowledged job is found after the restarts (${found}/${total}, lost ${total - found})`);
tap(terminal === found, `every job reached a terminal state (${terminal}/${found})`);
tap(succeeded === found, `every job succeeded (${succeeded}/${found})`);
tap(noHistory === 0, `every job has its history (${found - noHistory}/${found})`);
tap(rerunRecorded === 0, `no step whose completion was recorded ran again (${rerunRecorded})`);
tap(missingEffects === 0, `every step of every succeeded job left its side effect (missing ${missingEffects})`);
process.exit(failed ? 1 : 0);
