#!/usr/bin/env node
// lockext from Node.js (pg): a `withLock` helper and three scenarios.
//
//     node lockext_example.js [all|work|lost|pause]      (default: all)
//
// Connects to $LOCKEXT_URL (default postgresql://postgres@127.0.0.1:5499/postgres) and
// exits 0 only if every scenario behaved as it must:
//
// - work:  hold a 1 s lease for ~2.5 s of work; the background renewer keeps it, and every
//          write goes through lockext.fence in the writing transaction.
// - lost:  an operator releases the lease in the middle of the work; the next renewal
//          fails, and the work stops at its next check.
// - pause: holder A is frozen (SIGSTOP, like a long GC pause) past its lease; B takes the
//          lock with a higher token and writes; A is resumed and writes as if nothing
//          happened: the write is refused (SQLSTATE 55L01) and B's data stays.
//
// Fence tokens are bigint: below Number.MAX_SAFE_INTEGER since lockext 0.3.0, but above it
// on installations upgraded from 0.2.0, so they are parsed as BigInt here, never as Number. pg uses unnamed statements, so this works behind
// PgBouncer in transaction pooling mode (lockext keeps no session state).
'use strict'

const { spawn } = require('child_process')
const os = require('os')
const readline = require('readline')
const crypto = require('crypto')
const pg = require('pg')

pg.types.setTypeParser(20, BigInt) // int8 -> BigInt (fence tokens)

const URL = process.env.LOCKEXT_URL || 'postgresql://postgres@127.0.0.1:5499/postgres'
const TABLE = 'example_ledger_node'
const STALE = '55L01' // lockext: stale fence token

class LeaseLost extends Error {}
class StaleToken extends Error {}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

async function connect() {
  const c = new pg.Client({ connectionString: URL })
  c.on('error', () => {}) // a broken connection shows up as a failed query
  await c.connect()
  return c
}

class Lease {
  constructor(lockId, owner, token, ttlMs) {
    Object.assign(this, { lockId, owner, token, ttlMs })
    this.lost = false
    this.reason = null
    this.renewals = 0
    this.released = null // lock_release's answer, set when withLock ends
  }
  // Call before each step of work: throws LeaseLost once the renewer gave up.
  check() {
    if (this.lost) throw new LeaseLost(`lease on ${this.lockId} lost: ${this.reason}`)
  }
}

// Renews every `everyMs` on its own connection until stopped. A refused renewal ends the
// lease at once; failing calls are retried until the lease would have expired anyway (by
// our own clock, counted from the last successful call).
function startRenewer(lease, everyMs) {
  let stopped = false
  let wake = null
  const done = (async () => {
    let conn = null
    let validUntil = Date.now() + lease.ttlMs
    while (!stopped) {
      await new Promise((resolve) => {
        wake = resolve
        setTimeout(resolve, everyMs)
      })
      if (stopped) break
      const sent = Date.now()
      try {
        if (!conn) conn = await connect()
        const r = await conn.query('SELECT lockext.lock_renew($1, $2, $3::interval, $4) AS expiry', [
          lease.lockId, lease.owner, `${lease.ttlMs} milliseconds`, lease.token,
        ])
        if (r.rows[0].expiry === null) {
          lease.reason = 'renewal refused (expired, released or taken over)'
          lease.lost = true
          break
        }
        lease.renewals++
        validUntil = sent + lease.ttlMs
      } catch (e) {
        if (Date.now() >= validUntil) {
          lease.reason = `could not renew before expiry: ${e.message}`
          lease.lost = true
          break
        }
        if (conn) conn.end().catch(() => {})
        conn = null
      }
    }
    if (conn) await conn.end().catch(() => {})
  })()
  return async () => {
    stopped = true
    if (wake) wake()
    await done
  }
}

// Acquires `lockId` for `owner` (unique per holder), renews it in the background every
// ttl * renewFraction, runs `work(lease)`, and releases the lock at the end, whatever
// happened. Throws when the lock stays taken for `waitMs`.
async function withLock(lockId, owner, { ttlMs = 10000, waitMs = 30000, renewFraction = 1 / 3 }, work) {
  const conn = await connect()
  try {
    const r = await conn.query(
      'SELECT fence_token FROM lockext.lock_acquire($1, $2, $3::interval, wait => $4::interval)',
      [lockId, owner, `${ttlMs} milliseconds`, `${waitMs} milliseconds`]
    )
    const token = r.rows[0].fence_token
    if (token === null) throw new Error(`lock ${lockId} still taken after ${waitMs} ms`)
    const lease = new Lease(lockId, owner, token, ttlMs)
    const stop = startRenewer(lease, ttlMs * renewFraction)
    try {
      return await work(lease)
    } finally {
      await stop()
      try {
        const rel = await conn.query('SELECT lockext.lock_release($1, $2, $3) AS released', [lockId, owner, token])
        lease.released = rel.rows[0].released
      } catch (e) {
        // the lease ends by itself at its expiry
      }
    }
  } finally {
    await conn.end().catch(() => {})
  }
}

// Runs `sql` in one transaction that starts with lockext.fence(resource, token): if a
// newer token was fenced on `resource`, the transaction aborts and nothing is written.
async function fencedWrite(conn, lease, resource, sql, params) {
  await conn.query('BEGIN')
  try {
    await conn.query('SELECT lockext.fence($1, $2)', [resource, lease.token])
    await conn.query(sql, params)
    await conn.query('COMMIT')
  } catch (e) {
    await conn.query('ROLLBACK').catch(() => {})
    if (e.code === STALE) throw new StaleToken(e.message)
    throw e
  }
}

function writeAccount(conn, lease, account, writer, delta = 1) {
  return fencedWrite(
    conn, lease, `account:${account}`,
    `UPDATE ${TABLE} SET balance = balance + $1, last_writer = $2, last_token = $3 WHERE id = $4`,
    [delta, writer, lease.token, account]
  )
}

async function setup(conn, account) {
  await conn.query(`CREATE TABLE IF NOT EXISTS ${TABLE} ` +
    '(id text PRIMARY KEY, balance bigint NOT NULL, last_writer text, last_token bigint)')
  await conn.query(`INSERT INTO ${TABLE} (id, balance) VALUES ($1, 0)`, [account])
}

async function accountRow(conn, account) {
  const r = await conn.query(`SELECT balance, last_writer, last_token FROM ${TABLE} WHERE id = $1`, [account])
  return r.rows[0]
}

const newOwner = (role) => `${os.hostname()}:${process.pid}:${role}:${crypto.randomBytes(4).toString('hex')}`
const runId = () => `${process.pid}-${crypto.randomBytes(3).toString('hex')}`

// ---------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------

async function scenarioWork() {
  const rid = runId()
  const account = `work-${rid}`
  const conn = await connect()
  try {
    await setup(conn, account)
    let lease
    await withLock(`example:node:work:${rid}`, newOwner('worker'), { ttlMs: 1000 }, async (l) => {
      lease = l
      for (let i = 0; i < 10; i++) { // 10 steps of 250 ms: 2.5 leases long
        lease.check()
        await writeAccount(conn, lease, account, 'worker')
        await sleep(250)
      }
    })
    const row = await accountRow(conn, account)
    console.log(`work:  10 fenced writes committed=${row.balance}, renewals=${lease.renewals}, released=${lease.released}`)
    return row.balance === 10n && row.last_token === lease.token && lease.renewals >= 3 && lease.released === true
  } finally {
    await conn.end()
  }
}

async function scenarioLost() {
  const rid = runId()
  const account = `lost-${rid}`
  const lockId = `example:node:lost:${rid}`
  const conn = await connect()
  const operator = await connect()
  let steps = 0
  let stopped = null
  let lease
  try {
    await setup(conn, account)
    try {
      await withLock(lockId, newOwner('worker'), { ttlMs: 1000 }, async (l) => {
        lease = l
        for (let i = 0; i < 40; i++) { // would take 4 s
          lease.check()
          await writeAccount(conn, lease, account, 'worker')
          steps++
          if (i === 2) { // an operator clears the lock (lockext_admin may do it for any holder)
            await operator.query('SELECT lockext.lock_release($1, $2, $3)', [lockId, lease.owner, lease.token])
          }
          await sleep(100)
        }
      })
    } catch (e) {
      if (!(e instanceof LeaseLost)) throw e
      stopped = e
    }
    const row = await accountRow(conn, account)
    console.log(`lost:  work stopped after ${steps} of 40 steps (${stopped && stopped.message}); release returned ${lease.released}`)
    return stopped !== null && steps < 15 && row.balance === BigInt(steps) && lease.released === false
  } finally {
    await conn.end()
    await operator.end()
  }
}

// Reads lines from a child's stdout, one at a time.
function lineReader(stream) {
  const rl = readline.createInterface({ input: stream })
  const lines = []
  const waiters = []
  rl.on('line', (l) => (waiters.length ? waiters.shift()(l) : lines.push(l)))
  rl.on('close', () => waiters.splice(0).forEach((w) => w(null)))
  return () => (lines.length ? Promise.resolve(lines.shift()) : new Promise((resolve) => waiters.push(resolve)))
}

// Holder A: writes once, says `ready`, blocks on stdin (it is frozen there), then writes
// again without checking the lease, like code that checked it just before the pause.
async function pauseA(lockId, account) {
  const conn = await connect()
  const stdin = lineReader(process.stdin)
  let lease
  try {
    await withLock(lockId, newOwner('A'), { ttlMs: 1000 }, async (l) => {
      lease = l
      lease.check()
      await writeAccount(conn, lease, account, 'A')
      console.log(`ready ${lease.token}`)
      await stdin() // `go` was written while we were stopped
      await writeAccount(conn, lease, account, 'A')
    })
    console.log('stale write ACCEPTED')
    return 1
  } catch (e) {
    if (!(e instanceof StaleToken)) throw e
    console.log(`stale write refused: ${e.message}`)
    return lease.released === false ? 0 : 1
  } finally {
    process.stdin.destroy()
    await conn.end()
  }
}

// Holder B: waits for the lock, writes, releases; prints its token.
async function pauseB(lockId, account) {
  const conn = await connect()
  try {
    const token = await withLock(lockId, newOwner('B'), { ttlMs: 5000, waitMs: 10000 }, async (lease) => {
      await writeAccount(conn, lease, account, 'B', 100)
      return lease.token
    })
    console.log(`wrote ${token}`)
    return 0
  } finally {
    await conn.end()
  }
}

function self(args, stdio) {
  return spawn(process.execPath, [__filename, ...args], { stdio })
}

const exited = (child) => new Promise((resolve) => {
  if (child.exitCode !== null) resolve(child.exitCode)
  else child.on('exit', (code) => resolve(code))
})

async function scenarioPause() {
  const rid = runId()
  const account = `pause-${rid}`
  const lockId = `example:node:pause:${rid}`
  const conn = await connect()
  await setup(conn, account)
  const a = self(['pause-a', lockId, account], ['pipe', 'pipe', 'inherit'])
  const fromA = lineReader(a.stdout)
  let aToken, bToken, aSaid, aRc, bRc
  try {
    aToken = BigInt((await fromA()).split(' ')[1])
    process.kill(a.pid, 'SIGSTOP') // A, renewer included, is frozen past its 1 s lease
    a.stdin.write('go\n')
    const b = self(['pause-b', lockId, account], ['ignore', 'pipe', 'inherit'])
    const fromB = lineReader(b.stdout)
    const bLine = await fromB()
    bRc = await exited(b)
    if (bRc === 0 && bLine) bToken = BigInt(bLine.split(' ')[1])
    process.kill(a.pid, 'SIGCONT')
    aSaid = await fromA()
    aRc = await exited(a)
  } finally {
    if (a.exitCode === null) {
      process.kill(a.pid, 'SIGCONT')
      a.kill()
    }
  }
  const row = await accountRow(conn, account)
  await conn.end()
  console.log(`pause: A token ${aToken}; B token ${bToken}; A after resuming: ${aSaid}`)
  console.log(`       account: balance=${row.balance} last_writer=${row.last_writer} last_token=${row.last_token}`)
  return aRc === 0 && bRc === 0 && bToken > aToken &&
    row.balance === 101n && row.last_writer === 'B' && row.last_token === bToken
}

const SCENARIOS = { work: scenarioWork, lost: scenarioLost, pause: scenarioPause }

async function main(argv) {
  const mode = argv[2] || 'all'
  if (mode === 'pause-a') return pauseA(argv[3], argv[4])
  if (mode === 'pause-b') return pauseB(argv[3], argv[4])
  const names = mode === 'all' ? Object.keys(SCENARIOS) : [mode]
  let failed = 0
  for (const name of names) {
    if (!SCENARIOS[name]) throw new Error(`unknown scenario ${name}`)
    if (!(await SCENARIOS[name]())) failed++
  }
  console.log(`node: ${names.length - failed} passed, ${failed} failed`)
  return failed ? 1 : 0
}

main(process.argv).then(
  (rc) => process.exit(rc),
  (e) => {
    console.error(e)
    process.exit(2)
  }
)
