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
}

export class Grant {
  readonly lockId: string
  readonly owner: string
  readonly token: bigint
  readonly ttl: number
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
