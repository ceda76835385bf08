-- The highest token in lockext's own tables (run under the newest snapshot). It travels
-- with dumps even when the epoch row does not (its first write was still uncommitted when
-- the dump was taken, or the dump was of these tables only), so a new era also starts
-- above it.
-- No parameters.
SELECT greatest((SELECT max(fence_token) FROM lockext.locks),
                (SELECT max(fence_token) FROM lockext.shared_leases),
                (SELECT max(fence_token) FROM lockext.resources)) AS highest
