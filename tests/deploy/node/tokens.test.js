// lockext fencing tokens in a JavaScript client that keeps them as plain `number`s, the
// way the seed article's TypeScript interface declares them (`fenceToken: number`):
//
//     node --test tests/deploy/node/tokens.test.js
//
// node-postgres parses int8 as a string by default; this client does what such clients
// do, `Number(row.fence_token)`, and passes that number back as a query parameter. No
// BigInt anywhere. That is only sound while every token is <= Number.MAX_SAFE_INTEGER
// (2^53 - 1): above it, a Number is rounded (to a multiple of 8 near 2^55), two grants can
// become one number, and a rounded real token can be above every issued one (22023
// "never issued") or mismatch the lease it names.
//
// Scenarios: heartbeat (renew and release with the Number token), pause (a holder frozen
// with SIGSTOP past its lease writes late and is refused), contention (8 clients x 25
// cycles: distinct, increasing, accepted Number tokens), NOTIFY payloads (the JSON number
// in the payload equals the token's SQL text).
//
// Connects to $LOCKEXT_URL (default postgresql://postgres@127.0.0.1:5499/postgres). Uses
// pg from examples/node/node_modules (`cd examples/node && npm ci`), or from NODE_PATH.
'use strict'

const fs = require('fs')
const path = require('path')
const crypto = require('crypto')
const readline = require('readline')
const { spawn } = require('child_process')

let pg
try {
  pg = require(path.join(__dirname, '../../../examples/node/node_modules/pg'))
} catch (e) {
  pg = require('pg') // NODE_PATH
}

const URL = process.env.LOCKEXT_URL || 'postgresql://postgres@127.0.0.1:5499/postgres'
const RUN = `${process.pid}-${crypto.randomBytes(4).toString('hex')}`
const NEVER_ISSUED = '22023'

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

async function connect() {
  const c = new pg.Client({ connectionString: URL, application_name: 'lockext-node-tokens' })
  c.on('error', () => {}) // a broken connection shows up as a failed query
  await c.connect()
  return c
}

// The article's client: a grant with `fenceToken: number`, plus the token's SQL text
// (only for the checks, never used by the client logic).
async function acquire(c, lockId, owner, ttlMs, waitMs = 0) {
  const r = await c.query(
    'SELECT fence_token, fence_token::text AS token_text FROM lockext.lock_acquire($1, $2, $3::interval, wait => $4::interval)',
    [lockId, owner, `${ttlMs} milliseconds`, `${waitMs} milliseconds`]
  )
  const row = r.rows[0]
  if (!row || row.fence_token === null) return null
  return { lockId, owner, fenceToken: Number(row.fence_token), text: row.token_text }
}

// fenced_update with a Number token: { ok: true|false } or { error: sqlstate, message }.
async function fencedUpdate(c, resource, token, data) {
  try {
    const r = await c.query('SELECT lockext.fenced_update($1, $2, $3::jsonb) AS ok', [
      resource, token, JSON.stringify(data),
    ])
    return { ok: r.rows[0].ok }
  } catch (e) {
    return { error: e.code, message: e.message }
  }
}

async function release(c, grant) {
  try {
    const r = await c.query('SELECT lockext.lock_release($1, $2, $3) AS released', [
      grant.lockId, grant.owner, grant.fenceToken,
    ])
    return { ok: r.rows[0].released }
  } catch (e) {
    return { error: e.code, message: e.message }
  }
}

// Cleanup only (never part of what is checked): drop a lease by owner, without a token.
async function releaseByOwner(c, lockId, owner) {
  await c.query('SELECT lockext.lock_release($1, $2)', [lockId, owner]).catch(() => {})
}

const show = (x) => JSON.stringify(x)

// Checks that must all hold, collected so that one run reports every broken one.
class Problems {
  constructor() {
    this.list = []
  }
  check(ok, message) {
    if (!ok) this.list.push(message)
    return ok
  }
  // The token as a Number must be exact: safe, and printing back as its SQL text.
  token(grant, what) {
    this.check(Number.isSafeInteger(grant.fenceToken),
      `${what}: token ${grant.text} is not a safe integer (Number gives ${grant.fenceToken}, MAX_SAFE_INTEGER ${Number.MAX_SAFE_INTEGER})`)
    this.check(String(grant.fenceToken) === grant.text,
      `${what}: String(Number(token)) = ${String(grant.fenceToken)} but the SQL text is ${grant.text}`)
  }
  assertNone(assert) {
    if (this.list.length > 0) {
      assert.fail(`${this.list.length} problem(s):\n  - ${this.list.join('\n  - ')}`)
    }
  }
}

// Resolves once every thread of process pid is stopped (state T in /proc/PID/task/*/stat).
// kill(SIGSTOP) returns once the signal is queued: the one thread woken to take it stops the
// others only when it gets to run, and until then the rest of the process goes on.
async function waitStopped(pid, timeoutMs = 10000) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const live = []
    let tids = []
    try {
      tids = fs.readdirSync(`/proc/${pid}/task`)
    } catch (e) {} // gone: no live thread
    for (const tid of tids) {
      let stat
      try {
        stat = fs.readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8')
      } catch (e) {
        continue // a thread that just exited
      }
      const state = stat.slice(stat.lastIndexOf(')') + 1).trim()[0] // comm may hold ')'
      if (state !== 'Z' && state !== 'X') live.push(state) // a dead thread will not run again
    }
    if (live.length === 0) throw new Error(`holder A (pid ${pid}) exited`)
    if (live.every((state) => state === 'T')) return
    if (Date.now() > deadline) throw new Error(`holder A (pid ${pid}) not stopped ${timeoutMs} ms after SIGSTOP`)
    await sleep(5)
  }
}

// ---------------------------------------------------------------------------------------
// Holder A of the pause scenario, as a child process the parent can SIGSTOP.
// Protocol: JSON lines on stdout; it waits for a line on stdin before its late write.
// ---------------------------------------------------------------------------------------

async function holderMain() {
  const [lockId, owner, resource, ttlMs] = JSON.parse(process.env.LOCKEXT_TOKENS_HOLDER)
  const out = (m) => process.stdout.write(JSON.stringify(m) + '\n')
  const lines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]()
  const c = await connect()
  try {
    const grant = await acquire(c, lockId, owner, ttlMs)
    out({ event: 'acquired', grant })
    if (!grant) return
    out({ event: 'wrote', result: await fencedUpdate(c, resource, grant.fenceToken, { writer: 'A', step: 1 }) })
    await lines.next() // the parent says "write" after SIGCONT
    out({ event: 'late', result: await fencedUpdate(c, resource, grant.fenceToken, { writer: 'A', step: 2 }) })
  } finally {
    await c.end().catch(() => {})
  }
}

if (process.env.LOCKEXT_TOKENS_HOLDER) {
  holderMain().then(
    () => process.exit(0),
    (e) => {
      process.stdout.write(JSON.stringify({ event: 'crashed', message: String(e && e.stack) }) + '\n')
      process.exit(1)
    }
  )
} else {
  defineTests()
}

function defineTests() {
  const test = require('node:test')
  const assert = require('node:assert/strict')

  // -------------------------------------------------------------------------------------
  test('heartbeat: renew and release with the Number token', { timeout: 15000 }, async () => {
    const p = new Problems()
    const c = await connect()
    const lockId = `node-tokens:heartbeat:${RUN}`
    const owner = `heartbeat:${RUN}`
    try {
      const grant = await acquire(c, lockId, owner, 1000)
      assert.ok(grant, 'lock_acquire returned NULL on a fresh lock')
      p.token(grant, 'grant')
      const until = Date.now() + 2000
      let n = 0
      let refused = 0
      while (Date.now() < until) {
        await sleep(300)
        n++
        try {
          const r = await c.query('SELECT lockext.lock_renew($1, $2, $3::interval, $4) AS expiry', [
            lockId, owner, '1000 milliseconds', grant.fenceToken,
          ])
          if (r.rows[0].expiry === null) refused++
        } catch (e) {
          p.check(false, `renewal ${n} with token ${grant.fenceToken} (SQL ${grant.text}): error ${e.code} ${e.message}`)
        }
      }
      p.check(n >= 5, `only ${n} renewals in 2 s`)
      p.check(refused === 0,
        `${refused} of ${n} renewals refused (NULL) when passing the Number token ${grant.fenceToken} for the grant ${grant.text}`)
      const rel = await release(c, grant)
      p.check(rel.ok === true, `lock_release with the Number token ${grant.fenceToken} (grant ${grant.text}): ${show(rel)}`)
      if (rel.ok !== true) await releaseByOwner(c, lockId, owner)
    } finally {
      await c.end().catch(() => {})
    }
    p.assertNone(assert)
  })

  // -------------------------------------------------------------------------------------
  test('pause: a holder frozen past its lease writes late and is refused', { timeout: 20000 }, async () => {
    const p = new Problems()
    const lockId = `node-tokens:pause:${RUN}`
    const resource = `node-tokens:pause-resource:${RUN}`
    const ownerA = `pause-A:${RUN}`
    const ownerB = `pause-B:${RUN}`
    const ttlA = 500
    const child = spawn(process.execPath, [__filename], {
      env: { ...process.env, LOCKEXT_TOKENS_HOLDER: JSON.stringify([lockId, ownerA, resource, ttlA]) },
      stdio: ['pipe', 'pipe', 'inherit'],
    })
    const messages = readline.createInterface({ input: child.stdout })[Symbol.asyncIterator]()
    const next = async (event) => {
      const { value, done } = await messages.next()
      assert.ok(!done, `holder A exited before "${event}"`)
      const m = JSON.parse(value)
      assert.equal(m.event, event, `holder A: expected "${event}", got ${value}`)
      return m
    }
    const c = await connect()
    let stopped = false
    try {
      const { grant: a } = await next('acquired')
      assert.ok(a, 'holder A: lock_acquire returned NULL on a fresh lock')
      p.token(a, 'A')
      const first = (await next('wrote')).result
      p.check(first.ok === true, `A's write with its just-granted Number token ${a.fenceToken} (grant ${a.text}): ${show(first)}`)

      child.kill('SIGSTOP') // a long GC pause
      stopped = true
      await waitStopped(child.pid) // frozen before B starts waiting, not some time after

      // B waits for the lock: it gets it only once A's lease has expired (server clock).
      const b = await acquire(c, lockId, ownerB, 10000, 5000)
      assert.ok(b, `B did not get ${lockId} within 5 s of A's ${ttlA} ms lease`)
      p.token(b, 'B')
      p.check(BigInt(b.text) > BigInt(a.text), `server tokens not increasing: A ${a.text}, B ${b.text}`)
      p.check(b.fenceToken > a.fenceToken,
        `B's token as a Number (${b.fenceToken}, SQL ${b.text}) is not greater than A's (${a.fenceToken}, SQL ${a.text})`)
      const wb = await fencedUpdate(c, resource, b.fenceToken, { writer: 'B' })
      p.check(wb.ok === true, `B's write with its Number token ${b.fenceToken} (grant ${b.text}): ${show(wb)}`)

      child.kill('SIGCONT')
      stopped = false
      child.stdin.write('write\n')
      const late = (await next('late')).result
      p.check(late.ok === false,
        `A's late write with its old Number token ${a.fenceToken} must be refused (false), got ${show(late)}`)

      const r = await c.query('SELECT data::text AS data FROM lockext.resources WHERE resource_id = $1', [resource])
      const data = r.rows[0] && r.rows[0].data
      p.check(data !== undefined && data !== null && JSON.parse(data).writer === 'B',
        `the resource must keep B's data, has ${data}`)
      const rel = await release(c, b)
      p.check(rel.ok === true, `B's lock_release with its Number token ${b.fenceToken} (grant ${b.text}): ${show(rel)}`)
      if (rel.ok !== true) await releaseByOwner(c, lockId, ownerB)
    } finally {
      if (stopped) child.kill('SIGCONT')
      if (child.exitCode === null) child.kill('SIGKILL')
      await c.end().catch(() => {})
    }
    p.assertNone(assert)
  })

  // -------------------------------------------------------------------------------------
  test('contention: 8 clients x 25 cycles, distinct increasing accepted Number tokens', { timeout: 30000 }, async () => {
    const p = new Problems()
    const CLIENTS = 8
    const CYCLES = 25
    const lockId = `node-tokens:contention:${RUN}`
    const resource = `node-tokens:contention-resource:${RUN}`
    const all = [] // every grant, all clients
    const perClient = []
    let neverIssued = 0
    let rejected = 0
    let releaseRefused = 0
    const firstOf = {} // first example of each kind of problem

    const clients = await Promise.all(Array.from({ length: CLIENTS }, () => connect()))
    try {
      await Promise.all(clients.map(async (c, k) => {
        const owner = `contention-${k}:${RUN}`
        const mine = []
        perClient.push(mine)
        for (let i = 0; i < CYCLES; i++) {
          const g = await acquire(c, lockId, owner, 2000, 10000)
          if (!p.check(g !== null, `client ${k} cycle ${i}: no grant within 10 s`)) return
          mine.push(g)
          all.push(g)
          const w = await fencedUpdate(c, resource, g.fenceToken, { client: k, cycle: i })
          if (w.error === NEVER_ISSUED) {
            neverIssued++
            firstOf.neverIssued ??= `token ${g.text} passed as ${g.fenceToken}: ${w.message}`
          } else if (w.ok !== true) {
            rejected++
            firstOf.rejected ??= `token ${g.text} passed as ${g.fenceToken}: ${show(w)}`
          }
          const rel = await release(c, g)
          if (rel.ok !== true) {
            releaseRefused++
            firstOf.releaseRefused ??= `token ${g.text} passed as ${g.fenceToken}: ${show(rel)}`
            await releaseByOwner(c, lockId, owner) // so the others need not wait for the ttl
          }
        }
      }))
    } finally {
      await Promise.all(clients.map((c) => c.end().catch(() => {})))
    }

    const total = CLIENTS * CYCLES
    p.check(all.length === total, `${all.length} grants, expected ${total}`)
    p.check(new Set(all.map((g) => g.text)).size === all.length, 'the server handed out a token twice')
    const numbers = new Set(all.map((g) => g.fenceToken))
    p.check(numbers.size === all.length,
      `${all.length} grants but only ${numbers.size} distinct Number tokens (${all.length - numbers.size} collisions)`)
    const unsafe = all.filter((g) => !Number.isSafeInteger(g.fenceToken) || String(g.fenceToken) !== g.text)
    p.check(unsafe.length === 0,
      `${unsafe.length} of ${all.length} tokens are not exact safe integers as Numbers, e.g. ${unsafe.slice(0, 3).map((g) => `${g.text} -> ${g.fenceToken}`).join(', ')}`)
    perClient.forEach((mine, k) => {
      let flat = 0
      for (let i = 1; i < mine.length; i++) if (!(mine[i].fenceToken > mine[i - 1].fenceToken)) flat++
      p.check(flat === 0, `client ${k}: ${flat} of its ${mine.length - 1} successive Number tokens not strictly increasing`)
    })
    p.check(neverIssued === 0, `${neverIssued} fenced_update calls with a just-granted token failed 22023, e.g. ${firstOf.neverIssued}`)
    p.check(rejected === 0, `${rejected} fenced_update calls with a just-granted token not accepted, e.g. ${firstOf.rejected}`)
    p.check(releaseRefused === 0, `${releaseRefused} lock_release calls with the Number token refused, e.g. ${firstOf.releaseRefused}`)
    p.assertNone(assert)
  })

  // -------------------------------------------------------------------------------------
  test('NOTIFY payloads: fence_token as a JSON number equals the SQL token text', { timeout: 20000 }, async () => {
    const p = new Problems()
    const listener = await connect()
    const c = await connect()
    const c2 = await connect()
    const received = []
    let wake = null
    listener.on('notification', (msg) => {
      if (msg.channel !== 'lockext') return
      let parsed
      try {
        parsed = JSON.parse(msg.payload)
      } catch (e) {
        parsed = { unparsable: msg.payload }
      }
      received.push({ parsed, payload: msg.payload })
      if (wake) wake()
    })
    const waitFor = async (event, lockId, ms) => {
      const deadline = Date.now() + ms
      for (;;) {
        const hit = received.find((n) => n.parsed.event === event && n.parsed.lock_id === lockId)
        if (hit) return hit
        const left = deadline - Date.now()
        if (left <= 0) return null
        await new Promise((resolve) => {
          wake = resolve
          setTimeout(resolve, Math.min(left, 100))
        })
      }
    }
    try {
      await listener.query('LISTEN lockext')
      await c.query('SET lockext.notify = on')
      await c2.query('SET lockext.notify = on')

      // released
      const relId = `node-tokens:notify-released:${RUN}`
      const relOwner = `notify-released:${RUN}`
      const g = await acquire(c, relId, relOwner, 10000)
      assert.ok(g, 'lock_acquire returned NULL on a fresh lock')
      const rel = await release(c, g)
      if (!p.check(rel.ok === true, `lock_release with the Number token ${g.fenceToken} (grant ${g.text}): ${show(rel)}`)) {
        await c.query('SELECT lockext.lock_release($1, $2)', [relId, relOwner]) // still cause the event
      }
      const r = await waitFor('released', relId, 3000)
      if (p.check(r, `no "released" notification for ${relId}`)) {
        p.check(typeof r.parsed.fence_token === 'number', `released: fence_token is not a JSON number: ${r.payload}`)
        p.check(String(r.parsed.fence_token) === g.text,
          `released: JSON.parse(payload).fence_token is ${String(r.parsed.fence_token)}, the SQL token is ${g.text} (payload ${r.payload})`)
      }

      // taken_over: A's lease expires, B (waiting) takes it over. Should the reaper delete
      // the expired lease first, B's grant is a fresh one (no taken_over): try again.
      let t = null
      let a = null
      let b = null
      for (let attempt = 0; attempt < 4 && !t; attempt++) {
        const toId = `node-tokens:notify-taken-over:${RUN}:${attempt}`
        a = await acquire(c, toId, `notify-A:${RUN}`, 300)
        assert.ok(a, 'lock_acquire returned NULL on a fresh lock')
        b = await acquire(c2, toId, `notify-B:${RUN}`, 10000, 3000)
        assert.ok(b, `B did not get ${toId} within 3 s of A's 300 ms lease`)
        t = await waitFor('taken_over', toId, 1500)
        await releaseByOwner(c2, toId, `notify-B:${RUN}`)
      }
      if (p.check(t, 'no "taken_over" notification in 4 attempts')) {
        p.check(typeof t.parsed.fence_token === 'number', `taken_over: fence_token is not a JSON number: ${t.payload}`)
        p.check(String(t.parsed.fence_token) === b.text,
          `taken_over: JSON.parse(payload).fence_token is ${String(t.parsed.fence_token)}, the SQL token is ${b.text} (payload ${t.payload})`)
        p.check(String(t.parsed.previous_fence_token) === a.text,
          `taken_over: JSON.parse(payload).previous_fence_token is ${String(t.parsed.previous_fence_token)}, the SQL token is ${a.text} (payload ${t.payload})`)
        p.check(t.parsed.fence_token !== t.parsed.previous_fence_token,
          `taken_over: fence_token and previous_fence_token are the same number ${t.parsed.fence_token} (payload ${t.payload})`)
      }
    } finally {
      await Promise.all([listener, c, c2].map((x) => x.end().catch(() => {})))
    }
    p.assertNone(assert)
  })
}
