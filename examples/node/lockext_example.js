#!/usr/bin/env node
// lockext from Node.js (pg), with the lockext client library: three scenarios.
//
//     node lockext_example.js [all|work|lost|pause]      (default: all)
//
// Connects to $LOCKEXT_URL (default postgresql://postgres@127.0.0.1:5499/postgres) and
// exits 0 only if every scenario behaved as it must:
//
// - work:  hold a 1 s lease for ~2.5 s of work; the library renews it in the background, and every
//          write goes through lockext.fence in the writing transaction.
// - lost:  an operator releases the lease in the middle of the work; the next renewal
//          fails, and the work stops at its next check.
// - pause: holder A is frozen (SIGSTOP, like a long GC pause) past its lease; B takes the
//          lock with a higher token and writes; A is resumed and writes as if nothing
//          happened: the write is refused (SQLSTATE 55L01) and B's data stays.
//
// Uses the lockext client library (clients/node, a dependency of this folder: `npm ci`),
// which renews in the background, keeps fence tokens as BigInt (never a Number, which
// rounds above 2^53: tokens of installations upgraded from 0.2.0 are that big), and sends
// unnamed statements, so this works behind PgBouncer in transaction pooling mode (lockext
// keeps no session state).
'use strict'

const { spawn } = require('child_process')
const readline = require('readline')
const crypto = require('crypto')
const fs = require('fs')
const pg = require('pg')
const lockext = require('lockext')

pg.types.setTypeParser(20, BigInt) // int8 -> BigInt: this program's own rows (balance, last_token)

const URL = process.env.LOCKEXT_URL || 'postgresql://postgres@127.0.0.1:5499/postgres'
const TABLE = 'example_ledger_node'

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

async function connect() {
  const c = new pg.Client({ connectionString: URL })
  c.on('error', () => {}) // a broken connection shows up as a failed query
  await c.connect()
  return c
}

const update = (conn, token, account, writer, delta) => conn.query(
  `UPDATE ${TABLE} SET balance = balance + $1, last_writer = $2, last_token = $3 WHERE id = $4`,
  [delta, writer, token.toString(), account]
)

// One transaction that starts with lockext.fence(account, token): if a newer token was
// fenced there, it aborts (lockext.StaleToken) and nothing is written.
function writeAccount(conn, grant, account, writer, delta = 1) {
  return grant.transaction(conn, { fence: `account:${account}` }, (c) => update(c, grant.token, account, writer, delta))
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
    let grant
    // The owner defaults to hostname:pid:random; ttl and wait are seconds.
    await lockext.withLock(URL, `example:node:work:${rid}`, { ttl: 1 }, async (g) => {
      grant = g
      for (let i = 0; i < 10; i++) { // 10 steps of 250 ms: 2.5 leases long
        grant.check()
        await writeAccount(conn, grant, account, 'worker')
        await sleep(250)
      }
    })
    const row = await accountRow(conn, account)
    console.log(`work:  10 fenced writes committed=${row.balance}, renewals=${grant.renewals}, released=${grant.released}`)
    return row.balance === 10n && row.last_token === grant.token && grant.renewals >= 3 && grant.released === true
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
  let grant
  try {
    await setup(conn, account)
    try {
      await lockext.withLock(URL, lockId, { ttl: 1 }, async (g) => {
        grant = g
        for (let i = 0; i < 40; i++) { // would take 4 s
          grant.check() // or hand grant.signal to whatever can be aborted
          await writeAccount(conn, grant, account, 'worker')
          steps++
          if (i === 2) { // an operator clears the lock (lockext_admin may do it for any holder)
            await operator.query('SELECT lockext.lock_release($1, $2, $3)', [lockId, grant.owner, grant.token.toString()])
          }
          await sleep(100)
        }
      })
    } catch (e) {
      if (!(e instanceof lockext.LeaseLost)) throw e
      stopped = e
    }
    const row = await accountRow(conn, account)
    console.log(`lost:  work stopped after ${steps} of 40 steps (${stopped && stopped.message}); release returned ${grant.released}`)
    return stopped !== null && steps < 15 && row.balance === BigInt(steps) && grant.released === false
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
// again without checking the lease, like code that checked it just before the pause (the
// library's grant.transaction would check, and refuse: its clock saw the TTL pass).
async function pauseA(lockId, account) {
  const conn = await connect()
  const stdin = lineReader(process.stdin)
  let grant
  try {
    await lockext.withLock(URL, lockId, { ttl: 1 }, async (g) => {
      grant = g
      await writeAccount(conn, grant, account, 'A')
      console.log(`ready ${grant.token}`)
      await stdin() // `go` was written while we were stopped
      await conn.query('BEGIN') // only the fence stands between this write and B's data
      try {
        await lockext.fence(conn, `account:${account}`, grant.token)
        await update(conn, grant.token, account, 'A', 1)
        await conn.query('COMMIT')
      } catch (e) {
        await conn.query('ROLLBACK')
        throw e
      }
    })
    console.log('stale write ACCEPTED')
    return 1
  } catch (e) {
    if (!(e instanceof lockext.StaleToken)) throw e
    console.log(`stale write refused: ${e.message}`)
    return grant.released === false ? 0 : 1
  } finally {
    process.stdin.destroy()
    await conn.end()
  }
}

// Holder B: waits for the lock, writes, releases; prints its token.
async function pauseB(lockId, account) {
  const conn = await connect()
  try {
    const token = await lockext.withLock(URL, lockId, { ttl: 5, wait: 10 }, async (grant) => {
      await writeAccount(conn, grant, account, 'B', 100)
      return grant.token
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

// Resolves once every thread of process pid is stopped (state T in /proc/PID/task/*/stat).
// process.kill(pid, 'SIGSTOP') is not enough: it returns once the signal is queued, and the
// one thread woken to take it stops the others only when it gets to run; until then the
// rest of a multi-threaded process (node has several threads) goes on, and could read and
// act on what we write to its stdin.
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
      // "tid (comm) S ...": comm may hold spaces and ')', the state follows the last ')'.
      const state = stat.slice(stat.lastIndexOf(')') + 1).trim()[0]
      if (state !== 'Z' && state !== 'X') live.push(state) // a dead thread will not run again
    }
    if (live.length === 0) throw new Error(`no live thread of process ${pid} in /proc/${pid}/task: it exited (or this is not Linux)`)
    if (live.every((state) => state === 'T')) return
    if (Date.now() > deadline) throw new Error(`process ${pid} not stopped ${timeoutMs} ms after SIGSTOP`)
    await sleep(5)
  }
}

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
    await waitStopped(a.pid)
    a.stdin.write('go\n') // A reads it only once resumed
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
