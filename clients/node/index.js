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
const { inspect } = require('util')

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

// lockext's errors (docs/errors.md in its repository), where a distinct class helps the
// caller decide; other errors (connection failures, other SQLSTATEs) stay pg's.
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

// What was passed, as an error message shows it: a string quoted, so that '30' is not
// mistaken for 30.
const shown = (value) => inspect(value, { depth: 1, breakLength: Infinity })

// A bad argument, refused before anything is sent (no code: the server never saw it).
function invalid(message) {
  return new InvalidArgument(message)
}

// Seconds as a number; the SQL multiplies them into an interval (a bare number would make
// PostgreSQL look for lock_acquire(text, text, integer): 42883).
function seconds(value, name, zeroOk) {
  if (typeof value !== 'number' || !Number.isFinite(value)) {
    throw invalid(`${name} must be a finite number of seconds, got ${shown(value)}`)
  }
  if (value < 0 || (value === 0 && !zeroOk)) throw invalid(`${name} must be ${zeroOk ? '>= 0' : '> 0'}, got ${shown(value)}`)
  return value
}

// A lock id or owner: a non-empty string (the server bounds its length: 22001). Anything
// else would be sent as its String(): {a: 1} would name the lock '[object Object]'.
function identifier(value, name) {
  if (typeof value !== 'string' || value === '') throw invalid(`${name} must be a non-empty string, got ${shown(value)}`)
  return value
}

function modeOf(mode) {
  if (mode !== 'exclusive' && mode !== 'shared') throw invalid(`mode must be 'exclusive' or 'shared', got ${shown(mode)}`)
  return mode
}

function permitsOf(permits) {
  if (permits !== null && !Number.isSafeInteger(permits)) throw invalid(`permits must be an integer or null, got ${shown(permits)}`)
  return permits
}

function flag(value, name) {
  if (typeof value !== 'boolean') throw invalid(`${name} must be true or false, got ${shown(value)}`)
  return value
}

function renewEveryOf(ttl, renewEvery) {
  // A third of the TTL by default: two renewals may fail to arrive before the lease ends.
  const every = renewEvery === undefined ? ttl / 3 : seconds(renewEvery, 'renewEvery', false)
  if (every >= ttl) throw invalid(`renewEvery (${shown(every)} s) must be shorter than the ttl (${shown(ttl)} s)`)
  return every
}

// A token as it goes on the wire: its decimal text, never a Number that may be rounded.
function tokenText(token, name = 'a fence token') {
  if (typeof token === 'bigint' && token > 0n) return token.toString()
  if (typeof token === 'string' && /^[1-9][0-9]*$/.test(token)) return token
  if (Number.isSafeInteger(token) && token > 0) return String(token)
  throw invalid(`${name} is a positive BigInt or decimal string, got ${shown(token)}` +
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
    throw invalid('lockext needs a pg.Pool, a config object or a connection string: it opens a connection of its own, not one of yours (got a pg.Client)')
  }
  if (target && typeof target === 'object') return () => new (pgModule().Client)(copy(target))
  throw invalid(`expected a pg.Pool, a config object or a connection string, got ${shown(target)}`)
}

async function connect(factory, onError) {
  const client = factory()
  client.on('error', onError) // an idle connection that breaks must not crash the process
  await client.connect()
  return client
}

// valid_for: the grant's expiry less the time the server received the statement
// (statement_timestamp), in seconds. The statement was sent before it arrived, so the
// lease is live until at least `sent + valid_for` by our own clock, however long the call
// waited in the server (a waiting acquire is granted at the end of its wait, not its start).
const VALID_FOR = 'extract(epoch FROM expires_at - statement_timestamp())::float8 AS valid_for'
const ACQUIRE = `SELECT fence_token::text AS fence_token, expires_at, ${VALID_FOR} FROM lockext.lock_acquire($1::text, $2::text,
  $3::float8 * interval '1 second', wait => $4::float8 * interval '1 second', mode => $5::text,
  permits => $6::integer, session_bound => $7::boolean)`
// A lease attached to a keep-alive: sent only then, so that plain leases work with a server
// whose lock_acquire has no keepalive argument.
const ACQUIRE_ATTACHED = `SELECT fence_token::text AS fence_token, expires_at, ${VALID_FOR} FROM lockext.lock_acquire($1::text, $2::text,
  $3::float8 * interval '1 second', wait => $4::float8 * interval '1 second', mode => $5::text,
  permits => $6::integer, session_bound => $7::boolean, keepalive => $8::bigint)`
// Every lock of the set, attached to a keep-alive (lock_acquire_all: all or none).
const ACQUIRE_ALL_ATTACHED = `SELECT lock_id, fence_token::text AS fence_token, expires_at FROM lockext.lock_acquire_all($1::text[],
  $2::text, NULL, wait => $3::float8 * interval '1 second', mode => $4::text, keepalive => $5::bigint)`
const RENEW = "SELECT lockext.lock_renew($1::text, $2::text, $3::float8 * interval '1 second', $4::bigint) AS expires_at"
const RELEASE = 'SELECT lockext.lock_release($1::text, $2::text, $3::bigint) AS released'
const KEEPALIVE_GRANT = `SELECT keepalive::text AS keepalive, expires_at, ${VALID_FOR} FROM lockext.lock_keepalive_grant($1::float8 * interval '1 second')`
const KEEPALIVE_RENEW = "SELECT lockext.lock_keepalive_renew($1::bigint, $2::float8 * interval '1 second') AS expires_at"
const KEEPALIVE_REVOKE = 'SELECT lockext.lock_keepalive_revoke($1::bigint)::text AS ended'

const EXPIRED = 'no renewal succeeded within the TTL'

// What a lease and a keep-alive share: renewal every renewEvery on a connection of their
// own, the local clock, and loss (reason, signal; the first failure stops renewing).
// Subclasses give _renewQuery() and _lostError(). With `unref`, neither the timers nor the
// connection keep the process alive, except while a call of the caller's is in flight.
class Renewed {
  constructor(factory, client, { ttl, renewEvery, sent, validFor = null, expiresAt, unref = false }) {
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
    this._extend(sent, validFor === null ? ttl : validFor)
    if (this._renewMs !== null) this._schedule()
  }

  // AbortSignal aborted (reason: a LeaseLost) as soon as it is lost: hand it to whatever
  // can be cancelled (fetch, timers, your own loops).
  get signal() {
    return this._controller.signal
  }

  // True once a renewal failed or was refused, or the TTL passed without a successful
  // renewal by our own clock. One state: once true, `reason` says why and `signal` is
  // aborted, even before the timers had a chance to run (a blocked event loop).
  get lost() {
    if (this.reason === null && performance.now() >= this._validUntil) this._lose(EXPIRED)
    return this.reason !== null
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

  // Valid by our clock until `seconds` (the ttl, or the grant's valid_for) after the last
  // successful call was *sent* (the server's expiry is no earlier); a timer aborts the
  // signal then if nothing renewed it. Never once lost: lost stays lost.
  _extend(sent, seconds = this.ttl) {
    if (this._validUntil !== undefined && this.lost) return false
    this._validUntil = sent + seconds * 1000
    clearTimeout(this._expiryTimer)
    this._expiryTimer = this._timer(() => this._lose(EXPIRED), this._validUntil - performance.now())
    return true
  }

  _schedule() {
    this._renewTimer = this._timer(() => this._renew(), this._renewMs)
  }

  // The first failure ends it for us: a renewal that errs or returns NULL marks it lost
  // and stops, rather than retrying while the work goes on.
  async _renew() {
    if (this.lost) return // its time ran out while the event loop was busy: no renewal can help
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
    if (!this._extend(sent)) return // too late: lost meanwhile by our clock
    this.renewals++
    this.expiresAt = row.expires_at
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
  constructor(factory, client, { lockId, owner, token, expiresAt, ttl, renewEvery, sent, validFor = null, keepalive = null }) {
    super(factory, client, { ttl, renewEvery, sent, validFor, expiresAt })
    Object.assign(this, { lockId, owner, token })
    this.keepalive = keepalive // the KeepAlive (or its id) that renews this lease, or null
    this.released = null // lock_release's answer after release(): true, false (already gone), null (not sent)
    if (keepalive instanceof KeepAlive) keepalive._attach(this)
  }

  get lost() {
    if (this._client !== null) return super.lost
    const ka = this.keepalive instanceof KeepAlive ? this.keepalive : null
    if (this.reason === null && ka !== null && ka.lost) this._lose(`its keep-alive ${ka.id} was lost: ${ka.reason}`)
    return this.reason !== null
  }

  get _refused() {
    return 'renewal refused: the lease expired, was released or taken over'
  }

  _renewQuery() {
    return { text: RENEW, values: [this.lockId, this.owner, this.ttl, this.token.toString()] }
  }

  _lostError(prefix = 'lost') {
    const ka = this.keepalive instanceof KeepAlive ? this.keepalive : null
    const why = this.reason || (ka && ka.lost ? `its keep-alive ${ka.id} was lost: ${ka.reason}` : EXPIRED)
    return new LeaseLost(`lease on ${this.lockId} (token ${this.token}) ${prefix}: ${why}`)
  }

  // Stops renewing and releases this grant (by owner and token: never a newer one).
  // Resolves to lock_release's answer, also kept in `released`. Safe to call twice.
  release() {
    if (!this._closing) this._closing = this._release()
    return this._closing
  }

  async _release() {
    const query = { text: RELEASE, values: [this.lockId, this.owner, this.token.toString()] }
    const row = this._client === null && this.keepalive instanceof KeepAlive
      ? await this.keepalive._attaching(query).then((r) => r.rows[0], () => null)
      : await this._finish(query)
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
    if (fence !== null) identifier(fence, 'fence')
    flag(declare, 'declare')
    if (typeof fn !== 'function') throw invalid(`fn must be a function, got ${shown(fn)}`)
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
  if (options === null || typeof options !== 'object') throw invalid(`options must be an object, got ${shown(options)}`)
  if (options.keepalive !== undefined && options.keepalive !== null) return acquireAttached(clientFactory(target), lockId, options)
  const { ttl = 30, wait = 0, owner = defaultOwner(), renewEvery = undefined, mode = 'exclusive', permits = null, sessionBound = false } = options
  identifier(lockId, 'lockId')
  identifier(owner, 'owner')
  seconds(ttl, 'ttl', false)
  seconds(wait, 'wait', true)
  modeOf(mode)
  permitsOf(permits)
  flag(sessionBound, 'sessionBound')
  const every = renewEveryOf(ttl, renewEvery)
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
    return new Grant(factory, client, { lockId, owner, token: BigInt(row.fence_token), expiresAt: row.expires_at, ttl, renewEvery: every, sent, validFor: row.valid_for })
  } catch (e) {
    await client.end().catch(() => {})
    throw mapError(e)
  }
}

async function acquireAttached(factory, lockId, options) {
  const { ttl = null, wait = 0, owner = defaultOwner(), renewEvery = undefined, mode = 'exclusive', permits = null, sessionBound = false, keepalive } = options
  identifier(lockId, 'lockId')
  identifier(owner, 'owner')
  let keepaliveId
  if (keepalive instanceof KeepAlive) {
    keepalive.check()
    keepaliveId = keepalive.id.toString()
  } else {
    keepaliveId = tokenText(keepalive, 'keepalive') // a KeepAlive or its id
  }
  if (renewEvery !== undefined) throw invalid(`renewEvery: a lease attached to a keep-alive is renewed by the keep-alive, got ${shown(renewEvery)}`)
  // A ttl is sent as given, for the server to refuse (22023): it has no meaning here.
  if (ttl !== null) seconds(ttl, 'ttl', false)
  seconds(wait, 'wait', true)
  modeOf(mode)
  permitsOf(permits)
  flag(sessionBound, 'sessionBound')
  const query = { text: ACQUIRE_ATTACHED, values: [lockId, owner, ttl, wait, mode, permits, sessionBound, keepaliveId] }
  let row
  if (keepalive instanceof KeepAlive) {
    row = (await keepalive._attaching(query)).rows[0]
  } else {
    // Attached by id: a short connection of its own.
    const client = await connect(factory, () => {})
    try {
      row = (await client.query(query)).rows[0]
    } catch (e) {
      throw mapError(e, undefined, KEEPALIVE_NOT_LIVE)
    } finally {
      await client.end().catch(() => {})
    }
  }
  if (row.fence_token === null) {
    throw new NotAcquired(`lock ${lockId} is held by another owner${wait ? ` (waited ${wait} s)` : ''}`)
  }
  // No clock of its own: its life is the keep-alive's (or, by id, another program's).
  return new Grant(factory, null, { lockId, owner, token: BigInt(row.fence_token), expiresAt: row.expires_at, ttl: keepalive instanceof KeepAlive ? keepalive.ttl : null, renewEvery: null, sent: performance.now(), keepalive })
}

const REVOKED = 'revoked by its holder' // a KeepAlive's reason after its own revoke(): not a loss

// A keep-alive this process holds: one renewal (a timer, every renewEvery) for every lease
// attached to it. id: a BigInt, what lock_acquire's keepalive takes. Its timers and its
// connection do not keep the process alive (unref), except while a call of yours waits.
class KeepAlive extends Renewed {
  constructor(factory, client, { id, expiresAt, ttl, renewEvery, sent, validFor, onLost }) {
    super(factory, client, { ttl, renewEvery, sent, validFor, expiresAt, unref: true })
    this.id = id
    this.revoked = null // lock_keepalive_revoke's answer after revoke(): leases ended, or null
    this._onLost = onLost
    this._grants = new Set() // attached grants of this process, told when it is lost
    // The connection that attaches and releases its leases: one for all of them, opened at
    // the first attach, apart from the renewals' (an attach may wait for its lock, and a
    // renewal must not wait behind it). pg runs its queries one after another.
    this._attachClient = null
    this._attachTail = Promise.resolve() // its queries, one after another
  }

  // Runs `query` on the connection for attaching (opened the first time; once more if it
  // broke), after the ones sent before it; lockext's errors mapped, 55000 as LeaseLost.
  _attaching(query) {
    const run = this._attachTail.then(() => this._attachingNow(query))
    this._attachTail = run.catch(() => {})
    return run
  }

  async _attachingNow(query) {
    if (this._closing) { // revoked: a short connection of its own (a late release)
      const client = await connect(this._factory, () => {})
      try {
        return await client.query(query)
      } catch (e) {
        throw mapError(e, undefined, KEEPALIVE_NOT_LIVE)
      } finally {
        await client.end().catch(() => {})
      }
    }
    if (this._attachClient === null) {
      const opened = { client: null, broken: false }
      this._attachClient = connect(this._factory, () => { opened.broken = true }).then((c) => {
        opened.client = c
        if (this._unref) c.connection.stream.unref()
        return opened
      })
      this._attachClient.catch(() => { this._attachClient = null })
    }
    const opened = await this._attachClient
    this._socketOf(opened.client, 1)
    try {
      return await opened.client.query(query)
    } catch (e) {
      if (opened.broken && this._attachClient !== null) this._attachClient = null
      throw mapError(e, undefined, KEEPALIVE_NOT_LIVE)
    } finally {
      this._socketOf(opened.client, -1)
    }
  }

  _socketOf(client, delta) {
    client._lockextHeld = (client._lockextHeld || 0) + delta
    const stream = client.connection && client.connection.stream
    if (!this._unref || !stream || typeof stream.unref !== 'function') return
    if (client._lockextHeld > 0) stream.ref()
    else stream.unref()
  }

  // Takes every lock of `lockIds` attached to this keep-alive in one call
  // (lockext.lock_acquire_all: all or none, in the order of the ids' bytes): resolves to
  // the Grants, one per distinct id, so sorted, all with the same owner. Rejects with
  // NotAcquired if one is taken (and still taken after `wait`): then none is taken.
  // options: owner, wait, mode.
  async acquireAll(lockIds, options = {}) {
    if (!Array.isArray(lockIds) || lockIds.length === 0) throw invalid(`lockIds must be a non-empty array of lock ids, got ${shown(lockIds)}`)
    const { owner = defaultOwner(), wait = 0, mode = 'exclusive' } = options
    for (const id of lockIds) identifier(id, 'a lock id')
    identifier(owner, 'owner')
    seconds(wait, 'wait', true)
    modeOf(mode)
    this.check()
    const { rows } = await this._attaching({ text: ACQUIRE_ALL_ATTACHED, values: [lockIds, owner, wait, mode, this.id.toString()] })
    if (rows.length === 0) throw new NotAcquired(`one of the locks ${shown(lockIds)} is held by another owner${wait ? ` (waited ${wait} s)` : ''}`)
    return rows.map((row) => new Grant(this._factory, null, { lockId: row.lock_id, owner, token: BigInt(row.fence_token), expiresAt: row.expires_at, ttl: this.ttl, renewEvery: null, sent: performance.now(), keepalive: this }))
  }

  get _refused() {
    return 'renewal refused: the keep-alive expired, was revoked or ended by a grant over its leases'
  }

  _renewQuery(ttl = null) {
    return { text: KEEPALIVE_RENEW, values: [this.id.toString(), ttl] }
  }

  _lostError(prefix = 'lost') {
    return new LeaseLost(`keep-alive ${this.id} ${prefix}: ${this.reason || EXPIRED}`)
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
    if (this.lost) throw this._lostError() // once lost, for good: its grants were told so
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
    if (!this._extend(sent, ttl === null ? this.ttl : ttl)) throw this._lostError() // too late by our clock
    this.renewals++
    this.expiresAt = row.expires_at
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
    if (this._attachClient !== null) {
      await this._attachTail // what was sent before the revoke
      const opened = await this._attachClient.catch(() => null)
      this._attachClient = null
      if (opened) await opened.client.end().catch(() => {})
    }
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
  if (options === null || typeof options !== 'object') throw invalid(`options must be an object, got ${shown(options)}`)
  const { ttl = 30, renewEvery = undefined, background = true, onLost = null } = options
  seconds(ttl, 'ttl', false)
  const every = renewEveryOf(ttl, renewEvery)
  flag(background, 'background')
  if (onLost !== null && typeof onLost !== 'function') throw invalid(`onLost must be a function, got ${shown(onLost)}`)
  const factory = clientFactory(target)
  const client = await connect(factory, () => {})
  try {
    const sent = performance.now()
    const row = (await client.query(KEEPALIVE_GRANT, [ttl])).rows[0]
    return new KeepAlive(factory, client, { id: BigInt(row.keepalive), expiresAt: row.expires_at, ttl, renewEvery: background ? every : null, sent, validFor: row.valid_for, onLost })
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
  identifier(resourceId, 'resourceId')
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
  identifier(resourceId, 'resourceId')
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
