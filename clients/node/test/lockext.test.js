// lockext (Node.js client) against a real cluster:
//
//     LOCKEXT_URL=postgresql://postgres@127.0.0.1:5499/postgres node --test clients/node/test/
//
// LOCKEXT_URL is what the library connects to (a PgBouncer in transaction pooling mode,
// say); LOCKEXT_DIRECT_URL (default: LOCKEXT_URL) reaches the server itself, for what a
// pooler hides: a backend to terminate, a second database. LOCKEXT_NODE_APP, when set, is
// an application directory where lockext was installed (`npm install ./clients/node`):
// lockext and pg are loaded from there, so the installed package is what is tested.
'use strict'

const { test, describe, before, after } = require('node:test')
const assert = require('node:assert/strict')
const crypto = require('crypto')
const os = require('os')
const path = require('path')
const { createRequire } = require('module')
const { performance } = require('perf_hooks')

const from = createRequire(path.join(process.env.LOCKEXT_NODE_APP || path.join(__dirname, '..'), 'package.json'))
const lockext = from('lockext')
const pg = from('pg')

const URL = process.env.LOCKEXT_URL || 'postgresql://postgres@127.0.0.1:5499/postgres'
const DIRECT_URL = process.env.LOCKEXT_DIRECT_URL || URL
const POOLED = URL !== DIRECT_URL
const ERA_DB = 'lockext_clients_era' // a second lockext database, with an adopted history: era >= 1

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
const newId = (what) => `node-client:${what}:${crypto.randomBytes(5).toString('hex')}`

async function connect(url = URL) {
  const c = new pg.Client({ connectionString: url })
  c.on('error', () => {})
  await c.connect()
  return c
}

async function eventually(predicate, ms) {
  const deadline = Date.now() + ms
  while (Date.now() < deadline) {
    if (await predicate()) return true
    await sleep(50)
  }
  return predicate()
}

// Behind a pooler, makes it open `n` server connections (transactions held open at once),
// so that with server_round_robin a client's next transactions go to other ones: state
// left in one (a named prepared statement) is then missed in the next.
async function warmPool(n = 4) {
  if (!POOLED) return
  const cs = await Promise.all(Array.from({ length: n }, () => connect()))
  const pids = new Set()
  for (const c of cs) {
    await c.query('BEGIN')
    pids.add((await c.query('SELECT pg_backend_pid() AS pid')).rows[0].pid)
  }
  for (const c of cs) {
    await c.query('COMMIT') // a client that leaves mid-transaction takes its server connection with it
    await c.end()
  }
  assert.equal(pids.size, n, `the pooler gave ${pids.size} server connections, not ${n}`)
}

let db
before(async () => {
  db = await connect()
})
after(async () => {
  await db.end()
})

const holder = async (lockId) =>
  (await db.query(`SELECT owner, fence_token::text AS token, pid, extract(epoch FROM expires_at - acquired_at)::float8 AS ttl
                   FROM lockext.holders WHERE lock_id = $1`, [lockId])).rows[0]

// Whether a rival owner's lock_acquire (no wait) is granted; releases it if so.
async function otherOwnerGets(lockId) {
  const owner = `rival:${crypto.randomBytes(4).toString('hex')}`
  const r = await db.query("SELECT fence_token FROM lockext.lock_acquire($1, $2, '5 seconds')", [lockId, owner])
  if (r.rows[0].fence_token === null) return false
  await db.query('SELECT lockext.lock_release($1, $2)', [lockId, owner])
  return true
}

describe('acquire', () => {
  test('grant: BigInt token, default owner, release at the end', async () => {
    const lockId = newId('basic')
    let seen
    const out = await lockext.withLock(URL, lockId, { ttl: 5 }, async (g) => {
      seen = g
      const h = await holder(lockId)
      assert.equal(typeof g.token, 'bigint')
      assert.equal(h.token, g.token.toString())
      assert.equal(h.owner, g.owner)
      const [host, pid, rnd] = g.owner.split(':')
      assert.deepEqual([host, pid], [os.hostname(), String(process.pid)])
      assert.ok(rnd)
      assert.equal(g.lost, false)
      assert.equal(g.signal.aborted, false)
      return 'result'
    })
    assert.equal(out, 'result')
    assert.equal(seen.released, true)
    assert.equal(await holder(lockId), undefined)
  })

  test('refused at once with NotAcquired, even for the same process', async () => {
    const lockId = newId('refused')
    const g = await lockext.acquire(URL, lockId, { ttl: 5 })
    try {
      const t0 = Date.now()
      await assert.rejects(lockext.acquire(URL, lockId, { ttl: 5 }), lockext.NotAcquired)
      assert.ok(Date.now() - t0 < 2000)
      assert.equal((await holder(lockId)).token, g.token.toString())
    } finally {
      await g.release()
    }
  })

  test('wait: granted when the holder releases, with a higher token', async () => {
    const lockId = newId('wait')
    const first = await lockext.acquire(URL, lockId, { ttl: 10 })
    // The release's answer and the waiter's grant come on two connections: the grant may
    // be read first, so the release is awaited before its answer is checked.
    let releasing
    setTimeout(() => { releasing = first.release() }, 500)
    const t0 = Date.now()
    const second = await lockext.acquire(URL, lockId, { ttl: 10, wait: 5 })
    const waited = Date.now() - t0
    await second.release()
    assert.ok(second.token > first.token)
    assert.ok(waited > 300 && waited < 4000, `waited ${waited} ms`)
    assert.equal(await releasing, true)
    assert.equal(first.released, true)
  })

  test('wait runs out: NotAcquired', async () => {
    const lockId = newId('wait-out')
    const g = await lockext.acquire(URL, lockId, { ttl: 10 })
    try {
      const t0 = Date.now()
      await assert.rejects(lockext.acquire(URL, lockId, { ttl: 10, wait: 0.5 }), lockext.NotAcquired)
      assert.ok(Date.now() - t0 > 400)
    } finally {
      await g.release()
    }
  })

  test('ttl and wait as numbers of seconds; bad ones refused before the server', async () => {
    for (const ttl of [2, 1.5]) {
      const lockId = newId('ttl')
      await lockext.withLock(URL, lockId, { ttl, wait: 1 }, async () => {
        assert.equal((await holder(lockId)).ttl, ttl)
      })
    }
    await assert.rejects(lockext.acquire(URL, newId('bad'), { ttl: '30' }), lockext.InvalidArgument)
    await assert.rejects(lockext.acquire(URL, newId('bad'), { ttl: NaN }), lockext.InvalidArgument)
    await assert.rejects(lockext.acquire(URL, newId('bad'), { ttl: 0 }), lockext.InvalidArgument)
    await assert.rejects(lockext.acquire(URL, newId('bad'), { ttl: 1, renewEvery: 1 }), lockext.InvalidArgument)
    await assert.rejects(lockext.acquire(URL, newId('bad'), { ttl: 2 * 86400 }), lockext.InvalidArgument) // the server's bound
  })

  test('a pg.Pool as target: its settings, a connection of our own', async () => {
    const pool = new pg.Pool({ connectionString: URL, max: 1 })
    try {
      const lockId = newId('pool')
      await lockext.withLock(pool, lockId, { ttl: 5 }, async (g) => {
        assert.equal((await holder(lockId)).token, g.token.toString())
        assert.equal(pool.totalCount, 0, 'the lease took a slot of the pool')
        await g.fencedUpdate(pool, newId('res'), { via: 'pool' })
      })
      const client = await connect()
      await assert.rejects(lockext.acquire(client, lockId), lockext.InvalidArgument) // not a client: it would be shared
      await client.end()
    } finally {
      await pool.end()
    }
  })
})

describe('arguments', () => {
  test('every bad argument: InvalidArgument, refused before the server, showing what was passed', async () => {
    const lockId = newId('args')
    const calls = [
      [() => lockext.acquire(URL, { a: 1 }), '{ a: 1 }'],
      [() => lockext.acquire(URL, 42), '42'],
      [() => lockext.acquire(URL, ''), "''"],
      [() => lockext.acquire(URL, lockId, { owner: '' }), "''"],
      [() => lockext.acquire(URL, lockId, { owner: 7 }), '7'],
      [() => lockext.acquire(URL, lockId, { ttl: '30' }), "'30'"],
      [() => lockext.acquire(URL, lockId, { ttl: NaN }), 'NaN'],
      [() => lockext.acquire(URL, lockId, { ttl: 0 }), '0'],
      [() => lockext.acquire(URL, lockId, { wait: -1 }), '-1'],
      [() => lockext.acquire(URL, lockId, { renewEvery: '1' }), "'1'"],
      [() => lockext.acquire(URL, lockId, { mode: 'exclusiv' }), "'exclusiv'"],
      [() => lockext.acquire(URL, lockId, { permits: '3' }), "'3'"],
      [() => lockext.acquire(URL, lockId, { sessionBound: 'yes' }), "'yes'"],
      [() => lockext.acquire(URL, lockId, { keepalive: 1.5 }), '1.5'],
      [() => lockext.acquire(URL, lockId, { keepalive: '1', owner: {} }), '{}'],
      [() => lockext.acquire(URL, lockId, 30), '30'],
      [() => lockext.acquire(42, lockId), '42'],
      [() => lockext.withLock(URL, [lockId], {}, async () => {}), `[ '${lockId}' ]`],
      [() => lockext.keepAlive(URL, { ttl: '30' }), "'30'"],
      [() => lockext.keepAlive(URL, { onLost: 'log' }), "'log'"],
      [() => lockext.keepAlive(URL, { background: 1 }), '1'],
      [() => lockext.fencedUpdate(db, '', 5n, {}), "''"],
      [() => lockext.fencedUpdate(db, 'r', 0, {}), '0'],
      [() => lockext.fence(db, 'r', '5a'), "'5a'"],
      [() => lockext.declareToken(db, true), 'true'],
    ]
    for (const [call, shown] of calls) {
      const e = await call().catch((x) => x)
      assert.ok(e instanceof lockext.InvalidArgument, `${shown}: ${e}`)
      assert.ok(e.message.includes(`got ${shown}`), e.message)
      assert.equal(e.code, undefined) // the client's own: nothing was sent
    }
    assert.equal(await holder(lockId), undefined)
    assert.equal(await holder('[object Object]'), undefined)
  })
})

describe('renewal', () => {
  test('a 1 s lease outlives its TTL; a rival is refused all along', async () => {
    const lockId = newId('renew')
    await warmPool()
    let grant
    await lockext.withLock(URL, lockId, { ttl: 1 }, async (g) => {
      grant = g
      const end = Date.now() + 3200
      while (Date.now() < end) {
        await sleep(400)
        g.check()
        assert.equal(await otherOwnerGets(lockId), false, 'a rival got a lock whose holder renews it')
      }
      assert.ok(g.renewals >= 5, `${g.renewals} renewals`)
      assert.equal(g.signal.aborted, false)
    })
    assert.equal(grant.released, true)
    assert.equal(await otherOwnerGets(lockId), true)
  })
})

describe('a grant that waited', () => {
  test('longer than its ttl: held from the grant, and renewed', async () => {
    const lockId = newId('long-wait')
    await db.query("SELECT lockext.lock_acquire($1, 'psql', '3 seconds')", [lockId]) // expires by itself
    const t0 = performance.now()
    const g = await lockext.acquire(URL, lockId, { ttl: 2, wait: 10 })
    try {
      assert.ok(performance.now() - t0 > 2000, 'it did not wait longer than its ttl')
      assert.equal(g.lost, false, g.reason)
      assert.equal(g.reason, null)
      assert.equal(g.signal.aborted, false)
      assert.ok(await eventually(() => g.renewals >= 2 || g.lost, 5000))
      assert.equal(g.lost, false, g.reason)
      g.check()
    } finally {
      assert.equal(await g.release(), true)
    }
  })
})

describe('loss', () => {
  test('a blocked event loop: lost, reason and signal agree at once, and stay so', async () => {
    const lockId = newId('paused')
    const g = await lockext.acquire(URL, lockId, { ttl: 1 })
    try {
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 1500) // a pause past the ttl
      // Before any timer had a chance to run:
      assert.equal(g.lost, true)
      assert.equal(g.reason, 'no renewal succeeded within the TTL')
      assert.equal(g.signal.aborted, true)
      assert.ok(g.signal.reason instanceof lockext.LeaseLost)
      const renewals = g.renewals
      await sleep(1000) // the timers run now: the renewal that was due must not revive it
      assert.equal(g.lost, true)
      assert.equal(g.reason, 'no renewal succeeded within the TTL')
      assert.equal(g.renewals, renewals)
      assert.throws(() => g.check(), lockext.LeaseLost)
    } finally {
      await g.release()
    }
  })

  test('released from outside: lost, signal aborted, withLock rejects', async () => {
    const lockId = newId('lost')
    let grant
    let abortedWith = null
    await assert.rejects(lockext.withLock(URL, lockId, { ttl: 1 }, async (g) => {
      grant = g
      g.signal.addEventListener('abort', () => (abortedWith = g.signal.reason))
      const r = await db.query('SELECT lockext.lock_release($1, $2, $3) AS ok', [lockId, g.owner, g.token.toString()])
      assert.equal(r.rows[0].ok, true)
      assert.ok(await eventually(() => g.signal.aborted, 1500), 'signal not aborted')
      assert.throws(() => g.check(), lockext.LeaseLost)
      await assert.rejects(g.fencedUpdate(db, newId('res'), {}), lockext.LeaseLost)
    }), lockext.LeaseLost)
    assert.ok(abortedWith instanceof lockext.LeaseLost)
    assert.match(grant.reason, /refused/)
    assert.equal(grant.released, false)
  })

  test('a lost lease fails withLock even when fn never checked', async () => {
    const lockId = newId('lost-unchecked')
    await assert.rejects(lockext.withLock(URL, lockId, { ttl: 1 }, async (g) => {
      await db.query('SELECT lockext.lock_release($1, $2)', [lockId, g.owner])
    }), lockext.LeaseLost)
  })

  test('connection terminated: lost at once, released on a fresh connection', { skip: POOLED && 'behind a pooler, a terminated server connection is replaced unseen' }, async () => {
    const lockId = newId('terminated')
    let grant
    await assert.rejects(lockext.withLock(URL, lockId, { ttl: 5 }, async (g) => {
      grant = g
      await db.query('SELECT pg_terminate_backend($1)', [(await holder(lockId)).pid])
      assert.ok(await eventually(() => g.signal.aborted, 1000), 'signal not aborted') // before the next renewal
    }), lockext.LeaseLost)
    assert.match(grant.reason, /connection lost|renewal failed/)
    assert.equal(grant.released, true)
    assert.equal(await holder(lockId), undefined)
  })

  test('session-bound: the lease ends with the connection', { skip: POOLED && 'session-bound leases mean nothing behind a transaction pooler' }, async () => {
    const lockId = newId('session')
    const g = await lockext.acquire(URL, lockId, { ttl: 60, sessionBound: true })
    await db.query('SELECT pg_terminate_backend($1)', [(await holder(lockId)).pid])
    assert.ok(await eventually(async () => (await holder(lockId)) === undefined, 2000), 'lease outlived its session')
    assert.ok(await eventually(() => g.lost, 1000))
    await g.release()
  })

  test('fn throws: the error propagates and the lock is released', async () => {
    const lockId = newId('exc')
    let grant
    await assert.rejects(lockext.withLock(URL, lockId, { ttl: 30 }, async (g) => {
      grant = g
      throw new SyntaxError('the work failed')
    }), SyntaxError)
    assert.equal(grant.released, true)
    assert.equal(await otherOwnerGets(lockId), true)
  })
})

describe('fencing', () => {
  const newerTokenWrites = async (resource) => {
    await lockext.withLock(URL, newId('newer'), { ttl: 5 }, (g) => g.fencedUpdate(db, resource, { writer: 'newer' }))
  }

  test('fencedUpdate, then StaleToken once a newer token wrote', async () => {
    const resource = newId('res')
    await lockext.withLock(URL, newId('fenced'), { ttl: 5 }, async (g) => {
      await g.fencedUpdate(db, resource, { writer: 'old' })
      await newerTokenWrites(resource)
      await assert.rejects(g.fencedUpdate(db, resource, { writer: 'old', again: true }), lockext.StaleToken)
    })
    const r = await db.query('SELECT data FROM lockext.resources WHERE resource_id = $1', [resource])
    assert.deepEqual(r.rows[0].data, { writer: 'newer' })
  })

  test('transaction with fence and fence_guard with declareToken: stale writes roll back', async () => {
    await db.query('CREATE TABLE IF NOT EXISTS node_client_jobs (id text PRIMARY KEY, state text, fence_token bigint)')
    await db.query('DROP TRIGGER IF EXISTS fence ON node_client_jobs')
    await db.query(`CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON node_client_jobs
                    FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard('fence_token')`)
    const job = newId('job')
    const resource = newId('res')
    const pool = new pg.Pool({ connectionString: URL, max: 2 })
    try {
      const old = await lockext.acquire(URL, newId('guard-old'), { ttl: 5 })
      await old.transaction(pool, { fence: resource }, (c) =>
        c.query("INSERT INTO node_client_jobs VALUES ($1, 'new', $2)", [job, old.token.toString()]))
      await old.transaction(pool, { declare: true }, (c) =>
        c.query("UPDATE node_client_jobs SET state = 'running' WHERE id = $1", [job]))
      let newer
      await lockext.withLock(URL, newId('guard-new'), { ttl: 5 }, async (g) => {
        newer = g.token
        await g.transaction(pool, { fence: resource }, (c) =>
          c.query("UPDATE node_client_jobs SET state = 'taken', fence_token = $2 WHERE id = $1", [job, g.token.toString()]))
      })
      await assert.rejects(old.transaction(pool, { declare: true }, (c) =>
        c.query("UPDATE node_client_jobs SET state = 'done' WHERE id = $1", [job])), lockext.StaleToken) // the trigger
      await assert.rejects(old.transaction(pool, { fence: resource }, (c) =>
        c.query("UPDATE node_client_jobs SET state = 'done', fence_token = $2 WHERE id = $1", [job, newer.toString()])), lockext.StaleToken) // the fence
      await old.release()
      const r = await db.query('SELECT state, fence_token::text AS t FROM node_client_jobs WHERE id = $1', [job])
      assert.deepEqual(r.rows[0], { state: 'taken', t: newer.toString() })
    } finally {
      await pool.end()
    }
  })
})

describe('tokens', () => {
  test('above 2^53 a token goes to the server digit for digit (BigInt or string; Number refused)', async () => {
    const big = 9007199254740993n // 2^53 + 1: as a Number it would be ...992
    for (const token of [big, big.toString()]) {
      const e = await lockext.fencedUpdate(db, newId('res'), token, {}).catch((x) => x)
      assert.ok(e instanceof lockext.InvalidArgument, String(e)) // 22023: never issued
      assert.match(e.message, /fence token 9007199254740993 was never issued/)
    }
    await assert.rejects(lockext.fencedUpdate(db, newId('res'), Number(big), {}), lockext.InvalidArgument)
  })

  describe('in a database whose tokens carry an era (> 2^41)', () => {
    let eraUrl
    before(async () => {
      const admin = await connect(DIRECT_URL)
      const exists = await admin.query('SELECT 1 FROM pg_database WHERE datname = $1', [ERA_DB])
      if (exists.rowCount === 0) await admin.query(`CREATE DATABASE ${ERA_DB}`).catch(() => {}) // the Python tests may race us
      await admin.end()
      const u = new globalThis.URL(DIRECT_URL)
      u.pathname = `/${ERA_DB}`
      eraUrl = u.toString()
      const c = await connect(eraUrl)
      await c.query('CREATE EXTENSION IF NOT EXISTS lockext')
      // As a superuser, a row as a dump from another cluster (system identifier 1) in era 1
      // would bring: the next grant adopts it, and the cluster's era goes above it.
      await c.query(`INSERT INTO lockext.token_epoch AS t
                       (singleton, epoch, layout, system_identifier, timeline, database, raised_at)
                     SELECT true, 1, 2, 1, 1, oid, now() FROM pg_database WHERE datname = current_database()
                     ON CONFLICT (singleton) DO UPDATE SET system_identifier = 1, layout = 2, epoch = GREATEST(t.epoch, 1)`)
      await c.end()
    })

    test('token exact end to end: grant, renewals, fenced write', async () => {
      const lockId = newId('big')
      const resource = newId('big-res')
      const c = await connect(eraUrl)
      try {
        await lockext.withLock(eraUrl, lockId, { ttl: 1 }, async (g) => {
          assert.equal(typeof g.token, 'bigint')
          assert.ok(g.token > 2n ** 41n, `token ${g.token}`)
          const r = await c.query(`SELECT l.fence_token::text AS t, (lockext.token_parts(l.fence_token)).era
                                   FROM lockext.locks l WHERE lock_id = $1`, [lockId])
          assert.equal(r.rows[0].t, g.token.toString())
          assert.ok(r.rows[0].era >= 1)
          await sleep(1500) // renewals name the grant by its token: they only match it exactly
          g.check()
          await g.fencedUpdate(c, resource, { ok: 1 })
          const w = await c.query('SELECT fence_token::text AS t FROM lockext.resources WHERE resource_id = $1', [resource])
          assert.equal(w.rows[0].t, g.token.toString())
        })
      } finally {
        await c.end()
      }
    })
  })
})
