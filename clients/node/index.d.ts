// Types for lockext (Node.js client). Tokens are BigInt: never a Number, which rounds above 2^53.
import type { Pool, PoolConfig, ClientConfig, ClientBase } from 'pg'

export type Target = Pool | ClientConfig | PoolConfig | string
export type Token = bigint | string

export interface AcquireOptions {
  /** Lease length in seconds (default 30). */
  ttl?: number
  /** Seconds to wait for the lock (default 0: refuse at once). */
  wait?: number
  /** Unique per holder; default hostname:pid:random (random per grant). */
  owner?: string
  /** Seconds between renewals (default ttl / 3). */
  renewEvery?: number
  mode?: 'exclusive' | 'shared'
  permits?: number | null
  sessionBound?: boolean
  /** Attach the lease to this keep-alive (or the id of one of the same role): no ttl, renewEvery or connection of its own. */
  keepalive?: KeepAlive | Token | null
}

export interface KeepAliveOptions {
  /** Time to live in seconds (default 30; the server's bound: 1 day). */
  ttl?: number
  /** Seconds between renewals (default ttl / 3). */
  renewEvery?: number
  /** false: no timer, call renew() yourself within each ttl (default true). */
  background?: boolean
  /** Called once when the keep-alive is found lost (not for your own revoke()). */
  onLost?: ((err: LeaseLost, keepAlive: KeepAlive) => void) | null
}

export type AttachOptions = Omit<AcquireOptions, 'ttl' | 'renewEvery' | 'keepalive'>

export class KeepAlive {
  readonly id: bigint
  readonly ttl: number
  expiresAt: Date
  renewals: number
  /** lock_keepalive_revoke's answer after revoke(): the number of leases it ended, or null. */
  revoked: number | null
  reason: string | null
  readonly lost: boolean
  /** Aborted (reason: a LeaseLost) when the keep-alive is lost or revoked. */
  readonly signal: AbortSignal
  check(): void
  renew(ttl?: number | null): Promise<Date>
  acquire(lockId: string, options?: AttachOptions): Promise<Grant>
  /** Every lock attached in one call (lock_acquire_all: all or none), sorted by the ids' bytes. */
  acquireAll(lockIds: string[], options?: Pick<AcquireOptions, 'owner' | 'wait' | 'mode'>): Promise<Grant[]>
  revoke(): Promise<number | null>
}

export class Grant {
  readonly lockId: string
  readonly owner: string
  readonly token: bigint
  /** The lease's ttl; for a lease attached to a KeepAlive, the keep-alive's (null: attached by id). */
  readonly ttl: number | null
  /** The KeepAlive (or its id) that renews this lease, or null. */
  readonly keepalive: KeepAlive | Token | null
  expiresAt: Date
  renewals: number
  released: boolean | null
  reason: string | null
  readonly lost: boolean
  readonly signal: AbortSignal
  check(): void
  release(): Promise<boolean | null>
  fencedUpdate(db: Pool | ClientBase, resourceId: string, data: unknown): Promise<void>
  transaction<T>(db: Pool | ClientBase, options: { fence?: string | null; declare?: boolean }, fn: (client: ClientBase) => Promise<T>): Promise<T>
  declareToken(client: ClientBase): Promise<void>
}

export function acquire(target: Target, lockId: string, options?: AcquireOptions): Promise<Grant>
export function keepAlive(target: Target, options?: KeepAliveOptions): Promise<KeepAlive>
export function withKeepAlive<T>(target: Target, options: KeepAliveOptions, fn: (keepAlive: KeepAlive) => Promise<T>): Promise<T>
export function withLock<T>(target: Target, lockId: string, options: AcquireOptions, fn: (grant: Grant) => Promise<T>): Promise<T>
export function fencedUpdate(db: Pool | ClientBase, resourceId: string, token: Token, data: unknown): Promise<void>
export function fence(client: ClientBase, resourceId: string, token: Token): Promise<void>
export function declareToken(client: ClientBase, token: Token): Promise<void>
export function defaultOwner(): string

export class LockextError extends Error { code?: string }
export class NotAcquired extends LockextError {}
export class LeaseLost extends LockextError {}
export class StaleToken extends LeaseLost {}
export class InvalidArgument extends LockextError {}
export class ReadOnlyServer extends LockextError {}
export class PermissionDenied extends LockextError {}
export class NotSupported extends LockextError {}
