// lockext client for Node.js (pg): leases renewed in the background, fenced writes.
//
//   await lockext.withLock(pool, 'job:7', { ttl: 30 }, async (grant) => { ... grant.signal ... })
//
// Tokens stay BigInt (or decimal strings on the wire) from the server to the server: they
// fit a Number on installations made since lockext 0.3.0, not on ones upgraded from
// 0.2.0, and a Number above 2^53 is silently rounded. See README.md for the rest.
'use strict'

const crypto = require('crypto')
const os = require('os')
const { performance } = require('perf_hooks')

class LockextError extends Error {
  constructor(message, { code, cause } = {}) {
    super(message, cause === undefined ? undefined : { cause })
    this.name = new.target.name
    this.code = code
  }
}
class NotAcquired extends LockextError {}
class LeaseLost extends LockextError {}
class StaleToken extends LeaseLost {} // 55L01, or fenced_update said false
class InvalidArgument extends LockextError {}
class ReadOnlyServer extends LockextError {}
class PermissionDenied extends LockextError {}
class NotSupported extends LockextError {}

// README's Errors section, where a distinct class helps the caller decide; other errors
// (connection failures, other SQLSTATEs) stay pg's.
const BY_SQLSTATE = {
  '55L01': StaleToken,
  22023: InvalidArgument,
  22004: InvalidArgument,
  22001: InvalidArgument,
  42809: InvalidArgument,
  25006: ReadOnlyServer,
  42501: PermissionDenied,
  '0A000': NotSupported,
  '2200H': LockextError,
  58030: LockextError,
}

function mapError(e, only) {
  const C = e && typeof e.code === 'string' && (!only || only.includes(e.code)) ? BY_SQLSTATE[e.code] : undefined
  return C ? new C(e.message, { code: e.code, cause: e }) : e
}

// Seconds as a number; the SQL multiplies them into an interval (a bare number would make
// PostgreSQL look for lock_acquire(text, text, integer): 42883).
function seconds(value, name, zeroOk) {
  if (typeof value !== 'number' || !Number.isFinite(value)) {
    throw new TypeError(`${name} must be a finite number of seconds, got ${String(value)}`)
  }
  if (value < 0 || (value === 0 && !zeroOk)) throw new RangeError(`${name} must be ${zeroOk ? '>= 0' : '> 0'}, got ${value}`)
  return value
}

// A token as it goes on the wire: its decimal text, never a Number that may be rounded.
function tokenText(token) {
  if (typeof token === 'bigint' && token > 0n) return token.toString()
  if (typeof token === 'string' && /^[1-9][0-9]*$/.test(token)) return token
  if (Number.isSafeInteger(token) && token > 0) return String(token)
  throw new RangeError(`a fence token is a positive BigInt or decimal string, got ${String(token)}` +
    (typeof token === 'number' ? ' (a Number beyond 2^53 may already be rounded)' : ''))
}

// host:pid:random, random per grant: lock_acquire gives an owner its own live grant back,
// so two grants of one process sharing an owner on one lock id would both "hold" it.
function defaultOwner() {
  return `${os.hostname()}:${process.pid}:${crypto.randomBytes(6).toString('hex')}`
}

// pg, found from the application when this package is linked (`npm install ./clients/node`
// makes a symlink, and Node resolves pg from the link's target, which has none).
function pgModule() {
  try {
    return require('pg')
  } catch (e) {
    const paths = [process.cwd(), require.main && require.main.path].filter(Boolean)
    return require(require.resolve('pg', { paths }))
  }
}

// A pg.Client of our own, so that renewals never queue behind the application's queries
// nor take a pool slot: from a pg.Pool (its Client class and the options it connects
// with), a config object, or a connection string.
function clientFactory(target) {
  const copy = (o) => {
    const c = Object.assign({}, o)
    if (o.password !== undefined) c.password = o.password // pg keeps it non-enumerable
    if (c.application_name === undefined) c.application_name = 'lockext-node' // lockext.holders shows it
    return c
  }
  if (typeof target === 'string') return () => new (pgModule().Client)(copy({ connectionString: target }))
  if (target && typeof target.Client === 'function' && target.options && typeof target.totalCount === 'number') {
    return () => new target.Client(copy(target.options)) // a pg.Pool
  }
  if (target && typeof target.query === 'function') {
    throw new TypeError('lockext needs a pg.Pool, a config object or a connection string: it opens a connection of its own, not one of yours')
  }
  if (target && typeof target === 'object') return () => new (pgModule().Client)(copy(target))
  throw new TypeError(`expected a pg.Pool, a config object or a connection string, got ${String(target)}`)
}

async function connect(factory, onError) {
  const client = factory()
  client.on('error', onError) // an idle connection that breaks must not crash the process
  await client.connect()
  return client
}

const ACQUIRE = `SELECT fence_token::text AS fence_token, expires_at FROM lockext.lock_acquire($1::text, $2::text,
  $3::float8 * interval '1 second', wait => $4::float8 * interval '1 second', mode => $5::text,
  permits => $6::integer, session_bound => $7::boolean)`
const RENEW = "SELECT lockext.lock_renew($1::text, $2::text, $3::float8 * interval '1 second', $4::bigint) AS expires_at"
const RELEASE = 'SELECT lockext.lock_release($1::text, $2::text, $3::bigint) AS released'

class Grant {
  constructor(factory, client, { lockId, owner, token, expiresAt, ttl, renewEvery, sent }) {
    Object.assign(this, { lockId, owner, token, expiresAt, ttl })
    this.renewals = 0
    this.released = null // lock_release's answer after release(): true, false (already gone), null (not sent)
    this.reason = null // why the lease was lost
    this._factory = factory
    this._client = client
    this._broken = false
    this._controller = new AbortController()
    this._renewMs = renewEvery * 1000
    this._closing = null
    this._inflight = null
    client.removeAllListeners('error')
    client.on('error', (e) => {
      this._broken = true
      this._lose(`connection lost: ${e.message}`)
    })
    this._extend(sent)
    this._schedule()
  }

  // AbortSignal aborted (reason: a LeaseLost) as soon as the lease is lost: hand it to
  // whatever can be cancelled (fetch, timers, your own loops).
  get signal() {
    return this._controller.signal
  }

  // True once a renewal failed or was refused, or the TTL passed without a successful
  // renewal by our own clock.
  get lost() {
    return this.reason !== null || performance.now() >= this._validUntil
  }

  check() {
    if (this.lost) throw this._lostError()
  }

  _lostError(prefix = 'lost') {
    return new LeaseLost(`lease on ${this.lockId} (token ${this.token}) ${prefix}: ${this.reason || 'no renewal succeeded within the TTL'}`)
  }

  _lose(reason) {
    if (this.reason !== null) return
    this.reason = reason
    clearTimeout(this._renewTimer)
    clearTimeout(this._expiryTimer)
    this._controller.abort(this._lostError())
  }

  // Valid by our clock until the ttl after the last successful call was *sent* (the
  // server's expiry is no later); a timer aborts the signal then if nothing renewed it.
  _extend(sent) {
    this._validUntil = sent + this.ttl * 1000
    clearTimeout(this._expiryTimer)
    this._expiryTimer = setTimeout(() => this._lose('no renewal succeeded within the TTL'), this._validUntil - performance.now())
  }

  _schedule() {
    this._renewTimer = setTimeout(() => this._renew(), this._renewMs)
  }

  // The first failure ends the lease for us: a renewal that errs or returns NULL marks
  // the grant lost and stops, rather than retrying while the work goes on.
  async _renew() {
    const sent = performance.now()
    // query_timeout: a renewal stuck in the network is a lost lease after one ttl.
    this._inflight = this._client.query({ text: RENEW, values: [this.lockId, this.owner, this.ttl, this.token.toString()], query_timeout: this.ttl * 1000 })
    let row
    try {
      row = (await this._inflight).rows[0]
    } catch (e) {
      return this._lose(`renewal failed: ${e.message}`)
    } finally {
      this._inflight = null
    }
    if (this._closing) return
    if (row.expires_at === null) return this._lose('renewal refused: the lease expired, was released or taken over')
    this.renewals++
    this.expiresAt = row.expires_at
    this._extend(sent)
    this._schedule()
  }

  // Stops renewing and releases this grant (by owner and token: never a newer one).
  // Resolves to lock_release's answer, also kept in `released`. Safe to call twice.
  release() {
    if (!this._closing) this._closing = this._release()
    return this._closing
  }

  async _release() {
    clearTimeout(this._renewTimer)
    clearTimeout(this._expiryTimer)
    if (this._inflight) await this._inflight.catch(() => {})
    let client = this._client
    try {
      if (this._broken) client = await connect(this._factory, () => {})
      const r = await client.query({ text: RELEASE, values: [this.lockId, this.owner, this.token.toString()], query_timeout: this.ttl * 1000 })
      this.released = r.rows[0].released
    } catch (e) {
      this.released = null // the lease ends by itself at its expiry
    }
    if (this.released === false) this._lose('lock_release found no live lease (it had expired, been released or taken over)')
    await Promise.all([...new Set([client, this._client])].map((c) => c.end().catch(() => {})))
    return this.released
  }

  // lockext.fenced_update with this grant's token: LeaseLost if the lease is already lost,
  // StaleToken if a newer token wrote the resource.
  fencedUpdate(db, resourceId, data) {
    this.check()
    return fencedUpdate(db, resourceId, this.token, data)
  }

  // fn(client) inside BEGIN ... COMMIT on `db` (a pg.Pool: a client is checked out; a
  // client: it must not be in a transaction already), after checking the lease and running
  // lockext.fence(fence, token) and/or lockext.declare_token(token). A stale token
  // (55L01, from the fence or a fence_guard trigger) rolls back and throws StaleToken.
  async transaction(db, { fence = null, declare = false } = {}, fn) {
    this.check()
    const pooled = typeof db.totalCount === 'number' && typeof db.release !== 'function'
    const client = pooled ? await db.connect() : db
    let failed = null
    try {
      await client.query('BEGIN')
      try {
        if (fence !== null) await client.query('SELECT lockext.fence($1::text, $2::bigint)', [fence, this.token.toString()])
        if (declare) await client.query('SELECT lockext.declare_token($1::bigint)', [this.token.toString()])
        const result = await fn(client)
        await client.query('COMMIT')
        return result
      } catch (e) {
        await client.query('ROLLBACK').catch((r) => (failed = r))
        throw mapError(e, ['55L01'])
      }
    } finally {
      if (pooled) client.release(failed || undefined) // a client that could not roll back is dropped
    }
  }

  declareToken(db) {
    return declareToken(db, this.token)
  }
}

// Takes `lockId` and resolves to a Grant renewed in the background until grant.release().
// options: ttl (seconds, default 30), wait (seconds, default 0: do not wait), owner,
// renewEvery (seconds, default ttl / 3), mode ('exclusive' | 'shared'), permits,
// sessionBound. Throws NotAcquired when the lock is taken (and still taken after `wait`).
async function acquire(target, lockId, options = {}) {
  const { ttl = 30, wait = 0, owner = defaultOwner(), renewEvery = undefined, mode = 'exclusive', permits = null, sessionBound = false } = options
  seconds(ttl, 'ttl', false)
  seconds(wait, 'wait', true)
  // A third of the TTL by default: two renewals may fail to arrive before the lease ends.
  const every = renewEvery === undefined ? ttl / 3 : seconds(renewEvery, 'renewEvery', false)
  if (every >= ttl) throw new RangeError(`renewEvery (${every} s) must be shorter than the ttl (${ttl} s)`)
  const factory = clientFactory(target)
  const client = await connect(factory, () => {})
  let row
  try {
    const sent = performance.now()
    const r = await client.query(ACQUIRE, [lockId, owner, ttl, wait, mode, permits, sessionBound])
    row = r.rows[0]
    // A refusal is a row of NULLs, not an empty result.
    if (row.fence_token === null) {
      throw new NotAcquired(`lock ${lockId} is held by another owner${wait ? ` (waited ${wait} s)` : ''}`)
    }
    return new Grant(factory, client, { lockId, owner, token: BigInt(row.fence_token), expiresAt: row.expires_at, ttl, renewEvery: every, sent })
  } catch (e) {
    await client.end().catch(() => {})
    throw mapError(e)
  }
}

// acquire, run fn(grant), release whatever happened. If the lease was lost (or the
// release found it gone) and fn did not throw, throws LeaseLost: the work may have run
// without the lock. Resolves to what fn resolved to.
async function withLock(target, lockId, options, fn) {
  const grant = await acquire(target, lockId, options)
  let result
  try {
    result = await fn(grant)
  } catch (e) {
    await grant.release()
    throw e
  }
  const lostBefore = grant.lost
  await grant.release()
  if (lostBefore || grant.released === false) throw grant._lostError('was lost before the end')
  return result
}

// lockext.fenced_update(resourceId, token, data) on a pg.Pool or client: StaleToken when
// it answers false (a newer token wrote there). data is anything JSON.stringify takes.
async function fencedUpdate(db, resourceId, token, data) {
  let r
  try {
    r = await db.query('SELECT lockext.fenced_update($1::text, $2::bigint, $3::jsonb) AS ok', [resourceId, tokenText(token), JSON.stringify(data)])
  } catch (e) {
    throw mapError(e)
  }
  if (r.rows[0].ok !== true) {
    throw new StaleToken(`fenced_update of ${resourceId} refused token ${token}: a newer holder has written`, { code: '55L01' })
  }
}

// lockext.fence in the transaction open on `client`: StaleToken (and that transaction is
// aborted) when a newer token was fenced on the resource.
async function fence(client, resourceId, token) {
  try {
    await client.query('SELECT lockext.fence($1::text, $2::bigint)', [resourceId, tokenText(token)])
  } catch (e) {
    throw mapError(e)
  }
}

// lockext.declare_token, for fence_guard: names the writer's token for the UPDATEs that
// leave the token column as it is and the DELETEs of the transaction open on `client`.
async function declareToken(client, token) {
  try {
    await client.query('SELECT lockext.declare_token($1::bigint)', [tokenText(token)])
  } catch (e) {
    throw mapError(e)
  }
}

module.exports = {
  acquire,
  withLock,
  fencedUpdate,
  fence,
  declareToken,
  defaultOwner,
  Grant,
  LockextError,
  NotAcquired,
  LeaseLost,
  StaleToken,
  InvalidArgument,
  ReadOnlyServer,
  PermissionDenied,
  NotSupported,
}
