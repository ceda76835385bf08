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

// 55000 where the call named a keep-alive: it is not live (expired, revoked, ended by a
// grant over its leases, or another role's). Elsewhere 55000 means other things (an older
// SQL script calling a newer library), so it is mapped only there.
const KEEPALIVE_NOT_LIVE = { '55000': LeaseLost }

function mapError(e, only, extra) {
  const code = e && typeof e.code === 'string' ? e.code : undefined
  const C = code === undefined ? undefined
    : (extra && extra[code]) || (!only || only.includes(code) ? BY_SQLSTATE[code] : undefined)
  return C ? new C(e.message, { code, cause: e }) : e
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
// A lease attached to a keep-alive: sent only then, so that plain leases work with a server
// whose lock_acquire has no keepalive argument.
const ACQUIRE_ATTACHED = `SELECT fence_token::text AS fence_token, expires_at FROM lockext.lock_acquire($1::text, $2::text,
  $3::float8 * interval '1 second', wait => $4::float8 * interval '1 second', mode => $5::text,
  permits => $6::integer, session_bound => $7::boolean, keepalive => $8::bigint)`
const RENEW = "SELECT lockext.lock_renew($1::text, $2::text, $3::float8 * interval '1 second', $4::bigint) AS expires_at"
const RELEASE = 'SELECT lockext.lock_release($1::text, $2::text, $3::bigint) AS released'
const KEEPALIVE_GRANT = "SELECT keepalive::text AS keepalive, expires_at FROM lockext.lock_keepalive_grant($1::float8 * interval '1 second')"
const KEEPALIVE_RENEW = "SELECT lockext.lock_keepalive_renew($1::bigint, $2::float8 * interval '1 second') AS expires_at"
const KEEPALIVE_REVOKE = 'SELECT lockext.lock_keepalive_revoke($1::bigint)::text AS ended'

// What a lease and a keep-alive share: renewal every renewEvery on a connection of their
// own, the local clock, and loss (reason, signal; the first failure stops renewing).
// Subclasses give _renewQuery() and _lostError(). With `unref`, neither the timers nor the
// connection keep the process alive, except while a call of the caller's is in flight.
class Renewed {
  constructor(factory, client, { ttl, renewEvery, sent, expiresAt, unref = false }) {
    this.ttl = ttl
    this.expiresAt = expiresAt
    this.renewals = 0
    this.reason = null // why it was lost
    this._factory = factory
    this._client = client
    this._broken = false
    this._controller = new AbortController()
    this._renewMs = renewEvery === null ? null : renewEvery * 1000
    this._unref = unref
    this._held = 0 // calls of the caller's in flight on the connection (unref: it is ref'd meanwhile)
    this._closing = null
    this._inflight = null
    if (client === null) return // a lease attached to a keep-alive: renewed by it
    client.removeAllListeners('error')
    client.on('error', (e) => {
      this._broken = true
      this._lose(`connection lost: ${e.message}`)
    })
    this._socket(0)
    this._extend(sent)
    if (this._renewMs !== null) this._schedule()
  }

  // AbortSignal aborted (reason: a LeaseLost) as soon as it is lost: hand it to whatever
  // can be cancelled (fetch, timers, your own loops).
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

  _lose(reason) {
    if (this.reason !== null) return false
    this.reason = reason
    clearTimeout(this._renewTimer)
    clearTimeout(this._expiryTimer)
    this._controller.abort(this._lostError())
    return true
  }

  _timer(fn, ms) {
    const t = setTimeout(fn, ms)
    if (this._unref) t.unref()
    return t
  }

  // With unref, the connection's socket too (pg has no API of its own for it): ref'd
  // while a call of the caller's waits on it, else the process could exit under its await.
  _socket(delta) {
    this._held += delta
    if (!this._unref) return
    const stream = this._client && this._client.connection && this._client.connection.stream
    if (!stream || typeof stream.unref !== 'function') return
    if (this._held > 0) stream.ref()
    else stream.unref()
  }

  async _heldQuery(query) {
    this._socket(1)
    try {
      return await this._client.query(query)
    } finally {
      this._socket(-1)
    }
  }

  // Valid by our clock until the ttl after the last successful call was *sent* (the
  // server's expiry is no later); a timer aborts the signal then if nothing renewed it.
  _extend(sent, ttl = this.ttl) {
    this._validUntil = sent + ttl * 1000
    clearTimeout(this._expiryTimer)
    if (this.reason === null) {
      this._expiryTimer = this._timer(() => this._lose('no renewal succeeded within the TTL'), this._validUntil - performance.now())
    }
  }

  _schedule() {
    this._renewTimer = this._timer(() => this._renew(), this._renewMs)
  }

  // The first failure ends it for us: a renewal that errs or returns NULL marks it lost
  // and stops, rather than retrying while the work goes on.
  async _renew() {
    const sent = performance.now()
    // query_timeout: a renewal stuck in the network is a loss after one ttl.
    this._inflight = this._client.query({ ...this._renewQuery(), query_timeout: this.ttl * 1000 })
    let row
    try {
      row = (await this._inflight).rows[0]
    } catch (e) {
      return this._lose(`renewal failed: ${e.message}`)
    } finally {
      this._inflight = null
    }
    if (this._closing) return
    if (row.expires_at === null) return this._lose(this._refused)
    this.renewals++
    this.expiresAt = row.expires_at
    this._extend(sent)
    this._schedule()
  }

  // Stops renewing and runs the last statement (release, revoke): its first row, or null
  // if it could not be sent. On a fresh connection if ours broke (or there is none).
  async _finish(query) {
    clearTimeout(this._renewTimer)
    clearTimeout(this._expiryTimer)
    if (this._inflight) await this._inflight.catch(() => {})
    let client = this._client
    let row = null
    try {
      if (this._broken || client === null) client = await connect(this._factory, () => {})
      const r = await client.query({ ...query, query_timeout: (this.ttl || 30) * 1000 })
      row = r.rows[0]
    } catch (e) {
      row = null
    }
    await Promise.all([...new Set([client, this._client])].filter(Boolean).map((c) => c.end().catch(() => {})))
    return row
  }
}

class Grant extends Renewed {
  constructor(factory, client, { lockId, owner, token, expiresAt, ttl, renewEvery, sent, keepalive = null }) {
    super(factory, client, { ttl, renewEvery, sent, expiresAt })
    Object.assign(this, { lockId, owner, token })
    this.keepalive = keepalive // the KeepAlive (or its id) that renews this lease, or null
    this.released = null // lock_release's answer after release(): true, false (already gone), null (not sent)
    if (keepalive instanceof KeepAlive) keepalive._attach(this)
  }

  get lost() {
    if (this._client === null) return this.reason !== null || (this.keepalive instanceof KeepAlive && this.keepalive.lost)
    return super.lost
  }

  get _refused() {
    return 'renewal refused: the lease expired, was released or taken over'
  }

  _renewQuery() {
    return { text: RENEW, values: [this.lockId, this.owner, this.ttl, this.token.toString()] }
  }

  _lostError(prefix = 'lost') {
    const ka = this.keepalive instanceof KeepAlive ? this.keepalive : null
    const why = this.reason || (ka && ka.lost ? `its keep-alive ${ka.id} was lost: ${ka.reason || 'no renewal succeeded within the TTL'}` : 'no renewal succeeded within the TTL')
    return new LeaseLost(`lease on ${this.lockId} (token ${this.token}) ${prefix}: ${why}`)
  }

  // Stops renewing and releases this grant (by owner and token: never a newer one).
  // Resolves to lock_release's answer, also kept in `released`. Safe to call twice.
  release() {
    if (!this._closing) this._closing = this._release()
    return this._closing
  }

  async _release() {
    const row = await this._finish({ text: RELEASE, values: [this.lockId, this.owner, this.token.toString()] })
    this.released = row === null ? null : row.released // null: the lease ends by itself at its expiry
    if (this.released === false) this._lose('lock_release found no live lease (it had expired, been released or taken over)')
    if (this.keepalive instanceof KeepAlive) this.keepalive._detach(this)
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
// keepalive: a KeepAlive (or the id of one of the same role that something else keeps
// alive): the lease is attached to it, with no ttl (passing one rejects with
// InvalidArgument, 22023), no renewal and no connection of its own; it is lost when the
// keep-alive is. A keep-alive that is not live rejects with LeaseLost (55000).
async function acquire(target, lockId, options = {}) {
  if (options.keepalive !== undefined && options.keepalive !== null) return acquireAttached(clientFactory(target), lockId, options)
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

async function acquireAttached(factory, lockId, options) {
  const { ttl = null, wait = 0, owner = defaultOwner(), renewEvery = undefined, mode = 'exclusive', permits = null, sessionBound = false, keepalive } = options
  let keepaliveId
  if (keepalive instanceof KeepAlive) {
    keepalive.check()
    keepaliveId = keepalive.id.toString()
  } else {
    keepaliveId = tokenText(keepalive) // RangeError for what is not an id
  }
  if (renewEvery !== undefined) throw new TypeError('renewEvery: a lease attached to a keep-alive is renewed by the keep-alive')
  // A ttl is sent as given, for the server to refuse (22023): it has no meaning here.
  if (ttl !== null) seconds(ttl, 'ttl', false)
  seconds(wait, 'wait', true)
  // A short connection of its own: the keep-alive's renewals must not wait behind a
  // `wait`, and an attached lease holds no connection.
  const client = await connect(factory, () => {})
  try {
    const sent = performance.now()
    const r = await client.query(ACQUIRE_ATTACHED, [lockId, owner, ttl, wait, mode, permits, sessionBound, keepaliveId])
    const row = r.rows[0]
    if (row.fence_token === null) {
      throw new NotAcquired(`lock ${lockId} is held by another owner${wait ? ` (waited ${wait} s)` : ''}`)
    }
    const kaTtl = keepalive instanceof KeepAlive ? keepalive.ttl : null
    return new Grant(factory, null, { lockId, owner, token: BigInt(row.fence_token), expiresAt: row.expires_at, ttl: kaTtl, renewEvery: null, sent, keepalive })
  } catch (e) {
    throw mapError(e, undefined, KEEPALIVE_NOT_LIVE)
  } finally {
    await client.end().catch(() => {})
  }
}

const REVOKED = 'revoked by its holder' // a KeepAlive's reason after its own revoke(): not a loss

// A keep-alive this process holds: one renewal (a timer, every renewEvery) for every lease
// attached to it. id: a BigInt, what lock_acquire's keepalive takes. Its timers and its
// connection do not keep the process alive (unref), except while a call of yours waits.
class KeepAlive extends Renewed {
  constructor(factory, client, { id, expiresAt, ttl, renewEvery, sent, onLost }) {
    super(factory, client, { ttl, renewEvery, sent, expiresAt, unref: true })
    this.id = id
    this.revoked = null // lock_keepalive_revoke's answer after revoke(): leases ended, or null
    this._onLost = onLost
    this._grants = new Set() // attached grants of this process, told when it is lost
  }

  get _refused() {
    return 'renewal refused: the keep-alive expired, was revoked or ended by a grant over its leases'
  }

  _renewQuery(ttl = null) {
    return { text: KEEPALIVE_RENEW, values: [this.id.toString(), ttl] }
  }

  _lostError(prefix = 'lost') {
    return new LeaseLost(`keep-alive ${this.id} ${prefix}: ${this.reason || 'no renewal succeeded within the TTL'}`)
  }

  _attach(grant) {
    if (this.reason !== null) grant._lose(`its keep-alive ${this.id} was lost: ${this.reason}`)
    else this._grants.add(grant)
  }

  _detach(grant) {
    this._grants.delete(grant)
  }

  // Once: the signal aborts, every attached grant is lost, then onLost(err, keepAlive). An
  // exception of onLost is reported as uncaught (process 'uncaughtException'), not thrown
  // into whatever found the loss.
  _lose(reason, { notify = true } = {}) {
    if (!super._lose(reason)) return false
    for (const g of this._grants) g._lose(`its keep-alive ${this.id} was lost: ${reason}`)
    this._grants.clear()
    if (notify && this._onLost) {
      const err = this.signal.reason
      try {
        this._onLost(err, this)
      } catch (e) {
        process.nextTick(() => { throw e })
      }
    }
    return true
  }

  // Renews it now, for `ttl` seconds this once (default: its own), extending every
  // attached lease; resolves to the new expiry. Rejects with LeaseLost, and marks it lost
  // (onLost), when the server refuses: it expired, was revoked or ended.
  async renew(ttl = null) {
    if (this._closing) throw this._lostError('was revoked')
    if (this.reason !== null) throw this._lostError() // once lost, for good: its grants were told so
    if (ttl !== null) seconds(ttl, 'ttl', false)
    const sent = performance.now()
    let row
    try {
      row = (await this._heldQuery({ ...this._renewQuery(ttl), query_timeout: this.ttl * 1000 })).rows[0]
    } catch (e) {
      const mapped = mapError(e)
      if (mapped instanceof InvalidArgument) throw mapped // a bad ttl: nothing renewed, nothing lost
      this._lose(`renewal failed: ${e.message}`)
      throw mapped
    }
    if (row.expires_at === null) {
      this._lose(this._refused)
      throw this._lostError()
    }
    this.renewals++
    this.expiresAt = row.expires_at
    if (this.reason === null) this._extend(sent, ttl === null ? this.ttl : ttl)
    return row.expires_at
  }

  // acquire() attached to this keep-alive (options as acquire's, without ttl/renewEvery).
  acquire(lockId, options = {}) {
    return acquireAttached(this._factory, lockId, { ...options, keepalive: this })
  }

  // Stops renewing and revokes it: every lease attached to it is released at once.
  // Resolves to the number of leases ended (a Number), also kept in `revoked`; null if it
  // could not be sent (it then expires by itself) or the server knows no such keep-alive
  // of this role (it is then marked lost). Safe to call twice.
  revoke() {
    if (!this._closing) this._closing = this._revoke()
    return this._closing
  }

  async _revoke() {
    this._socket(1) // the process stays up for the revoke
    const row = await this._finish({ text: KEEPALIVE_REVOKE, values: [this.id.toString()] })
    this.revoked = row === null || row.ended === null ? null : Number(row.ended)
    if (row !== null && row.ended === null) this._lose('lock_keepalive_revoke found no such keep-alive (revoked by another, or ended and deleted)')
    this._lose(REVOKED, { notify: false }) // not a loss: onLost is not called
    return this.revoked
  }
}

// Grants a keep-alive (lockext.lock_keepalive_grant) and resolves to it, renewed every
// third of the ttl until revoke(). options: ttl (seconds, default 30), renewEvery,
// background (default true; false: no timer, call renew() within each ttl), onLost(err,
// keepAlive): called once when it is found lost (not for your own revoke()).
async function keepAlive(target, options = {}) {
  const { ttl = 30, renewEvery = undefined, background = true, onLost = null } = options
  seconds(ttl, 'ttl', false)
  const every = renewEvery === undefined ? ttl / 3 : seconds(renewEvery, 'renewEvery', false)
  if (every >= ttl) throw new RangeError(`renewEvery (${every} s) must be shorter than the ttl (${ttl} s)`)
  if (onLost !== null && typeof onLost !== 'function') throw new TypeError('onLost must be a function')
  const factory = clientFactory(target)
  const client = await connect(factory, () => {})
  try {
    const sent = performance.now()
    const row = (await client.query(KEEPALIVE_GRANT, [ttl])).rows[0]
    return new KeepAlive(factory, client, { id: BigInt(row.keepalive), expiresAt: row.expires_at, ttl, renewEvery: background ? every : null, sent, onLost })
  } catch (e) {
    await client.end().catch(() => {})
    throw mapError(e)
  }
}

// keepAlive, run fn(keepAlive), revoke it whatever happened (every attached lease is
// released). If it was lost and fn did not throw, rejects with LeaseLost: the work may
// have run without its locks. Resolves to what fn resolved to.
async function withKeepAlive(target, options, fn) {
  const ka = await keepAlive(target, options)
  let result
  try {
    result = await fn(ka)
  } catch (e) {
    await ka.revoke()
    throw e
  }
  const lostBefore = ka.lost
  await ka.revoke()
  if (lostBefore || ka.reason !== REVOKED) throw ka._lostError('was lost before the end')
  return result
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
  keepAlive,
  withKeepAlive,
  fencedUpdate,
  fence,
  declareToken,
  defaultOwner,
  Grant,
  KeepAlive,
  LockextError,
  NotAcquired,
  LeaseLost,
  StaleToken,
  InvalidArgument,
  ReadOnlyServer,
  PermissionDenied,
  NotSupported,
}
