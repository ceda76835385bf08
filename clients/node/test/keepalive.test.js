// Keep-alives (lockext.keepAlive) against a real cluster: one renewal for many leases.
// Run as lockext.test.js (its header): LOCKEXT_URL, LOCKEXT_DIRECT_URL, LOCKEXT_NODE_APP.
'use strict'

const { test, describe, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { spawn } = require('child_process')
const crypto = require('crypto')
const path = require('path')
const { createRequire } = require('module')

const from = createRequire(path.join(process.env.LOCKEXT_NODE_APP || path.join(__dirname, '..'), 'package.json'))
const lockext = from('lockext')
const pg = from('pg')

const URL = process.env.LOCKEXT_URL || 'postgresql://postgres@127.0.0.1:5499/postgres'

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
const newId = (what) => `node-ka:${what}:${crypto.randomBytes(5).toString('hex')}`

async function eventually(predicate, ms) {
  const deadline = Date.now() + ms
  while (Date.now() < deadline) {
    if (await predicate()) return true
    await sleep(50)
  }
  return predicate()
}

let db
before(async () => {
  db = new pg.Client({ connectionString: URL })
  db.on('error', () => {})
  await db.connect()
})
after(async () => {
  await db.end()
})

// lock_id -> { token, expires } of the live leases attached to `ka`.
async function attached(ka) {
  const r = await db.query('SELECT lock_id, fence_token::text AS token, expires_at FROM lockext.holders WHERE keepalive = $1', [ka.id.toString()])
  return new Map(r.rows.map((x) => [x.lock_id, { token: x.token, expires: x.expires_at.getTime() }]))
}
const expiries = async (ka) => new Set([...(await attached(ka)).values()].map((x) => x.expires))

// A rival owner's lock_acquire, no wait: its token (BigInt), or null if refused (kept held).
async function rivalTakes(lockId) {
  const r = await db.query("SELECT fence_token::text AS t FROM lockext.lock_acquire($1, $2, '30 seconds')", [lockId, newId('rival')])
  return r.rows[0].t === null ? null : BigInt(r.rows[0].t)
}

const revokeElsewhere = async (ka) =>
  (await db.query('SELECT lockext.lock_keepalive_revoke($1::bigint)::int AS n', [ka.id.toString()])).rows[0].n

describe('keep-alive: attach and renew', () => {
  test('one connection attaches every lease, and releases them', async () => {
    const ids = Array.from({ length: 8 }, (_, i) => newId(`conn-${i}`))
    let made = 0 // connections lockext opens, through the pool's Client class
    class Counting extends pg.Client {
      constructor(config) {
        super(config)
        made++
      }
    }
    const pool = new pg.Pool({ connectionString: URL, Client: Counting })
    try {
      await lockext.withKeepAlive(pool, { ttl: 30 }, async (ka) => {
        const grants = await Promise.all(ids.map((id) => ka.acquire(id)))
        for (const g of grants.slice(0, 4)) assert.equal(await g.release(), true)
        assert.equal(made, 2) // the keep-alive's renewals', and one for attaching
        assert.deepEqual([...(await attached(ka)).keys()].sort(), ids.slice(4).sort())
      })
    } finally {
      await pool.end()
    }
  })

  test('acquireAll attaches many locks in one call, all or none', async () => {
    const ids = Array.from({ length: 3 }, (_, i) => newId(`all-${i}`))
    const ka = await lockext.keepAlive(URL, { ttl: 30 })
    try {
      const grants = await ka.acquireAll([...ids].reverse())
      assert.deepEqual(grants.map((g) => g.lockId), [...ids].sort())
      assert.equal(new Set(grants.map((g) => g.owner)).size, 1)
      assert.ok(grants.every((g) => g.keepalive === ka && !g.lost))
      const seen = await attached(ka)
      assert.deepEqual(new Map([...seen].map(([id, x]) => [id, x.token])), new Map(grants.map((g) => [g.lockId, g.token.toString()])))
      const taken = newId('all-taken')
      assert.notEqual(await rivalTakes(taken), null)
      await assert.rejects(ka.acquireAll([newId('all-x'), taken]), lockext.NotAcquired)
      assert.deepEqual([...(await attached(ka)).keys()].sort(), [...ids].sort())
    } finally {
      assert.equal(await ka.revoke(), 3)
    }
  })

  test('one renewal extends every attached lease', async () => {
    const ids = [0, 1, 2, 3].map((i) => newId(`part-${i}`))
    const ka = await lockext.keepAlive(URL, { ttl: 30, background: false })
    try {
      assert.equal(typeof ka.id, 'bigint')
      const grants = [await ka.acquire(ids[0]), await ka.acquire(ids[1]), await ka.acquire(ids[2]),
        await lockext.acquire(URL, ids[3], { keepalive: ka })] // the same, by acquire()
      assert.equal(new Set(grants.map((g) => g.token)).size, 4) // each its own grant and token
      assert.ok(grants.every((g) => g.keepalive === ka && !g.lost))
      const seen = await attached(ka)
      assert.deepEqual([...seen.keys()].sort(), [...ids].sort())
      assert.deepEqual(new Set([...seen.values()].map((x) => x.token)), new Set(grants.map((g) => g.token.toString())))
      assert.deepEqual(await expiries(ka), new Set([ka.expiresAt.getTime()]))
      for (const id of ids) assert.equal(await rivalTakes(id), null, id)

      const renewedTo = await ka.renew(3600)
      assert.equal(ka.expiresAt, renewedTo)
      assert.deepEqual(await expiries(ka), new Set([renewedTo.getTime()]), 'not every lease was extended')
      assert.ok(renewedTo.getTime() - Date.now() > 59 * 60 * 1000)
      const own = (await ka.renew()).getTime() - Date.now() // without a ttl: its own, 30 s
      assert.ok(own > 25000 && own <= 30500, `${own} ms`)
      assert.deepEqual(await expiries(ka), new Set([ka.expiresAt.getTime()]))
      const row = (await db.query('SELECT renewals, leases FROM lockext.keepalive_holders WHERE keepalive = $1', [ka.id.toString()])).rows[0]
      assert.deepEqual({ renewals: Number(row.renewals), leases: Number(row.leases) }, { renewals: 2, leases: 4 })
    } finally {
      assert.equal(await ka.revoke(), 4)
    }
  })

  test('the timer keeps 1 s leases past their ttl; a lease may be released alone', async () => {
    const ids = [0, 1, 2].map((i) => newId(`bg-${i}`))
    await lockext.withKeepAlive(URL, { ttl: 1 }, async (ka) => {
      const grants = await Promise.all(ids.map((id) => ka.acquire(id)))
      const end = Date.now() + 3200
      while (Date.now() < end) {
        await sleep(400)
        ka.check()
        for (const g of grants) g.check()
        assert.equal(await rivalTakes(ids[0]), null, 'a rival got a lock whose keep-alive is renewed')
      }
      assert.ok(ka.renewals >= 5, `${ka.renewals} renewals`)
      assert.equal((await expiries(ka)).size, 1)
      const inner = await ka.acquire(newId('inner'))
      assert.equal(await inner.release(), true)
      assert.equal((await attached(ka)).size, 3)
      assert.equal(ka.signal.aborted, false)
    })
  })

  test('fenced writes through an attached grant', async () => {
    const resource = newId('res')
    let token
    await lockext.withKeepAlive(URL, { ttl: 5 }, async (ka) => {
      const g = await ka.acquire(newId('fenced'))
      token = g.token
      await g.fencedUpdate(db, resource, { n: 1 })
      await g.transaction(db, { fence: resource }, async () => {})
    })
    const r = await db.query('SELECT fence_token::text AS t FROM lockext.resources WHERE resource_id = $1', [resource])
    assert.equal(r.rows[0].t, token.toString())
  })
})

describe('keep-alive: lapse, revoke, loss', () => {
  test('a lapsed keep-alive frees every lock at once', async () => {
    const lost = []
    const ids = [0, 1, 2].map((i) => newId(`lapse-${i}`))
    const resource = newId('lapse-res')
    const ka = await lockext.keepAlive(URL, { ttl: 1, onLost: (err, k) => lost.push([err, k]) })
    try {
      const grants = await Promise.all(ids.map((id) => ka.acquire(id)))
      await grants[0].fencedUpdate(db, resource, { writer: 'old' })
      assert.ok(await eventually(() => ka.renewals >= 2, 2000))
      clearTimeout(ka._renewTimer) // stands for a renewer that stopped (a blocked event loop)
      if (ka._inflight) await ka._inflight
      clearTimeout(ka._renewTimer)
      assert.ok(await eventually(async () => (await attached(ka)).size === 0, 2000), 'the keep-alive did not lapse')
      // By its own clock: lost, every attached grant too, onLost called once.
      assert.ok(await eventually(() => ka.lost && lost.length === 1, 1000))
      assert.ok(lost[0][0] instanceof lockext.LeaseLost)
      assert.equal(lost[0][1], ka)
      assert.match(ka.reason, /no renewal succeeded/)
      for (const g of grants) {
        assert.equal(g.signal.aborted, true)
        assert.throws(() => g.check(), lockext.LeaseLost)
      }
      // Another client takes each lock at once, with a newer token.
      for (const g of grants) {
        const t = await rivalTakes(g.lockId)
        assert.ok(t !== null && t > g.token, g.lockId)
      }
      await lockext.withLock(URL, newId('newer'), { ttl: 5 }, (n) => n.fencedUpdate(db, resource, { writer: 'newer' }))
      await assert.rejects(lockext.fencedUpdate(db, resource, grants[0].token, { writer: 'old again' }), lockext.StaleToken)
      // The grants ended it: renewing is refused; attaching by id is refused by the server (55000).
      await assert.rejects(ka.renew(), lockext.LeaseLost)
      const e = await lockext.acquire(URL, newId('late'), { keepalive: ka.id }).catch((x) => x)
      assert.ok(e instanceof lockext.LeaseLost, String(e))
      assert.equal(e.code, '55000')
      assert.equal(lost.length, 1)
    } finally {
      await ka.revoke()
    }
  })

  test('revoke ends every attached lease at once', async () => {
    const lost = []
    const ids = [0, 1, 2].map((i) => newId(`rev-${i}`))
    const ka = await lockext.keepAlive(URL, { ttl: 30, onLost: (err) => lost.push(err) })
    const grants = [await ka.acquire(ids[0]), await ka.acquire(ids[1], { mode: 'shared' }), await ka.acquire(ids[2], { permits: 2 })]
    assert.equal((await attached(ka)).size, 3)
    assert.equal(await ka.revoke(), 3)
    assert.equal((await attached(ka)).size, 0)
    for (const id of ids) assert.ok((await rivalTakes(id)) !== null, `${id} not free after the revoke`)
    assert.ok(grants.every((g) => g.lost && g.signal.aborted))
    assert.equal(await ka.revoke(), 3) // twice: the first answer
    await assert.rejects(ka.acquire(newId('after')), lockext.LeaseLost)
    await assert.rejects(ka.renew(), lockext.LeaseLost)
    assert.deepEqual(lost, [], 'onLost is for losses, not for the holder\'s own revoke')
    assert.equal(await grants[0].release(), false)
  })

  test('onLost fires when the keep-alive is revoked elsewhere; withKeepAlive rejects', async () => {
    let fired = null
    let grant
    await assert.rejects(lockext.withKeepAlive(URL, { ttl: 1.5, onLost: (err) => (fired = err) }, async (ka) => {
      grant = await ka.acquire(newId('fires'))
      await sleep(700)
      assert.equal(fired, null, 'fired while the keep-alive was live')
      assert.equal(await revokeElsewhere(ka), 1)
      assert.ok(await eventually(() => fired !== null, 1500), 'onLost did not fire')
      assert.match(ka.reason, /refused/)
      assert.ok(ka.signal.aborted && grant.signal.aborted)
      await assert.rejects(grant.fencedUpdate(db, newId('res'), { late: true }), lockext.LeaseLost)
    }), lockext.LeaseLost)
    assert.ok(fired instanceof lockext.LeaseLost)
  })

  test('onLost fires when a grant ends the expired keep-alive', async () => {
    let fired = false
    const lockId = newId('ended')
    const ka = await lockext.keepAlive(URL, { ttl: 3, onLost: () => (fired = true) })
    try {
      await ka.acquire(lockId)
      await db.query("UPDATE lockext.keepalives SET expires_at = clock_timestamp() - interval '1 second' WHERE keepalive = $1", [ka.id.toString()])
      assert.ok((await rivalTakes(lockId)) !== null) // ends the keep-alive, then takes over
      assert.ok(await eventually(() => fired, 2000), 'onLost did not fire') // the next renewal, 1 s on
      assert.match(ka.reason, /refused/)
    } finally {
      await ka.revoke()
    }
  })

  test('its timers and connection do not keep the process alive', async () => {
    const lockId = newId('unref')
    const script = `
      const lockext = require(process.argv[1])
      lockext.keepAlive(process.argv[2], { ttl: 30 }).then(async (ka) => {
        await ka.acquire(process.argv[3])
        console.log(ka.id.toString())
      })`
    const child = spawn(process.execPath, ['-e', script, from.resolve('lockext'), URL, lockId], { stdio: ['ignore', 'pipe', 'inherit'] })
    let out = ''
    child.stdout.on('data', (d) => (out += d))
    const code = await new Promise((resolve) => {
      const kill = setTimeout(() => child.kill('SIGKILL'), 5000)
      child.on('exit', (c, signal) => {
        clearTimeout(kill)
        resolve(signal || c)
      })
    })
    assert.equal(code, 0, 'the process did not exit by itself while its keep-alive was live')
    // It left its keep-alive to expire (30 s); the lock is still held by it meanwhile.
    const r = await db.query('SELECT keepalive::text AS k FROM lockext.holders WHERE lock_id = $1', [lockId])
    assert.equal(r.rows[0].k, out.trim())
    assert.equal(await revokeElsewhere({ id: out.trim() }), 1)
  })
})

describe('keep-alive: errors', () => {
  test('bad input is refused and changes nothing', async () => {
    const lockId = newId('bad')
    await lockext.withKeepAlive(URL, { ttl: 30 }, async (ka) => {
      let e = await lockext.acquire(URL, lockId, { ttl: 5, keepalive: ka }).catch((x) => x) // a ttl with a keep-alive
      assert.ok(e instanceof lockext.InvalidArgument, String(e))
      assert.equal(e.code, '22023')
      e = await lockext.acquire(URL, lockId, { sessionBound: true, keepalive: ka }).catch((x) => x)
      assert.ok(e instanceof lockext.InvalidArgument, String(e))
      e = await lockext.acquire(URL, lockId, { keepalive: ka.id + 1000000000n }).catch((x) => x) // no such keep-alive
      assert.ok(e instanceof lockext.LeaseLost, String(e))
      assert.equal(e.code, '55000')
      await assert.rejects(lockext.acquire(URL, lockId, { keepalive: 1.5 }), lockext.InvalidArgument)
      await assert.rejects(lockext.acquire(URL, lockId, { keepalive: ka, renewEvery: 1 }), lockext.InvalidArgument)
      for (const [bad, shown] of [[[], '[]'], ['abc', "'abc'"], [[{ a: 1 }], '{ a: 1 }'], [['a', ''], "''"]]) {
        const e = await ka.acquireAll(bad).catch((x) => x)
        assert.ok(e instanceof lockext.InvalidArgument, String(e))
        assert.ok(e.message.includes(shown), e.message)
      }
      await assert.rejects(ka.renew(2 * 86400), lockext.InvalidArgument)
      assert.equal(ka.lost, false, 'a refused argument is not a loss')
      assert.equal((await db.query('SELECT 1 FROM lockext.locks WHERE lock_id = $1', [lockId])).rowCount, 0)
      assert.equal((await attached(ka)).size, 0)
    })
    const e = await lockext.keepAlive(URL, { ttl: 2 * 86400 }).catch((x) => x)
    assert.ok(e instanceof lockext.InvalidArgument, String(e))
    assert.equal(e.code, '22023')
    await assert.rejects(lockext.keepAlive(URL, { ttl: 0 }), lockext.InvalidArgument)
    await assert.rejects(lockext.keepAlive(URL, { ttl: '30' }), /got '30'/)
    await assert.rejects(lockext.keepAlive(URL, { ttl: 1, renewEvery: 1 }), lockext.InvalidArgument)
  })
})
