// lockext from Go (pgx v4): a WithLock helper and three scenarios.
//
//	GO111MODULE=off GOPATH=/usr/share/gocode go build -o lockext-example . && ./lockext-example [all|work|lost|pause]
//
// (Debian's golang-github-jackc-pgx-v4-dev puts pgx v4 in /usr/share/gocode; elsewhere,
// `go mod init example && go get github.com/jackc/pgx/v4` and a plain `go build`.)
//
// Connects to $LOCKEXT_URL (default postgresql://postgres@127.0.0.1:5499/postgres) and
// exits 0 only if every scenario behaved as it must:
//
//   - work:  hold a 1 s lease for ~2.5 s of work; the background renewer keeps it, and every
//     write goes through lockext.fence in the writing transaction.
//   - lost:  an operator releases the lease in the middle of the work; the next renewal
//     fails, and the work stops at its next check.
//   - pause: holder A is frozen (SIGSTOP, like a long GC pause) past its lease; B takes the
//     lock with a higher token and writes; A is resumed and writes as if nothing happened:
//     the write is refused (SQLSTATE 55L01) and B's data stays.
//
// Statements are described with the unnamed statement instead of being prepared under a
// name (stmtcache.ModeDescribe), so that this works behind PgBouncer in transaction
// pooling mode; lockext itself keeps no session state.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgconn/stmtcache"
	"github.com/jackc/pgx/v4"
)

const table = "example_ledger_go"

// ErrLeaseLost: the lease ended (renewal refused or impossible): stop working.
var ErrLeaseLost = errors.New("lease lost")

// ErrStaleToken: lockext.fence refused our token (SQLSTATE 55L01): a newer holder wrote.
var ErrStaleToken = errors.New("stale fence token")

func url() string {
	if u := os.Getenv("LOCKEXT_URL"); u != "" {
		return u
	}
	return "postgresql://postgres@127.0.0.1:5499/postgres"
}

func connect(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(url())
	if err != nil {
		return nil, err
	}
	cfg.BuildStatementCache = func(conn *pgconn.PgConn) stmtcache.Cache {
		return stmtcache.New(conn, stmtcache.ModeDescribe, 64)
	}
	return pgx.ConnectConfig(ctx, cfg)
}

// Lease is a grant held by WithLock.
type Lease struct {
	LockID, Owner string
	Token         int64 // bigint; below 2^53 since 0.3.0, above it on installations upgraded from 0.2.0
	TTL           time.Duration
	Renewals      int
	Released      *bool // lock_release's answer, set when WithLock ends

	mu     sync.Mutex
	reason string
	ctx    context.Context
	cancel context.CancelFunc
}

// Check returns ErrLeaseLost (wrapped) once the renewer gave up: call it before each step.
func (l *Lease) Check() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.reason != "" {
		return fmt.Errorf("%w: %s: %s", ErrLeaseLost, l.LockID, l.reason)
	}
	return nil
}

// Context is cancelled when the lease is lost: pass it to long queries to abandon them.
func (l *Lease) Context() context.Context { return l.ctx }

func (l *Lease) lose(reason string) {
	l.mu.Lock()
	l.reason = reason
	l.mu.Unlock()
	l.cancel()
}

// renew extends the lease every `every` on its own connection until stop is closed. A
// refused renewal ends the lease at once; failing calls are retried until the lease would
// have expired anyway (by our own clock, counted from the last successful call).
func renew(l *Lease, every time.Duration, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	validUntil := time.Now().Add(l.TTL)
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ticker.C:
		}
		sent := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), every)
		var expiry *time.Time
		var err error
		if conn == nil {
			conn, err = connect(ctx)
		}
		if err == nil {
			err = conn.QueryRow(ctx, "SELECT lockext.lock_renew($1, $2, $3, $4)",
				l.LockID, l.Owner, l.TTL, l.Token).Scan(&expiry)
		}
		cancel()
		switch {
		case err != nil:
			if time.Now().After(validUntil) {
				l.lose("could not renew before expiry: " + err.Error())
				return
			}
			if conn != nil {
				conn.Close(context.Background())
				conn = nil
			}
		case expiry == nil:
			l.lose("renewal refused (expired, released or taken over)")
			return
		default:
			l.Renewals++
			validUntil = sent.Add(l.TTL)
		}
	}
}

// WithLock acquires lockID for owner (unique per holder), renews it in the background every
// ttl/3, runs work, and releases the lock at the end, whatever happened. It fails when the
// lock stays taken for `wait`. When the lease was lost, its error wraps ErrLeaseLost.
func WithLock(ctx context.Context, lockID, owner string, ttl, wait time.Duration, work func(*Lease) error) (*Lease, error) {
	conn, err := connect(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	var token *int64
	err = conn.QueryRow(ctx, "SELECT fence_token FROM lockext.lock_acquire($1, $2, $3, wait => $4)",
		lockID, owner, ttl, wait).Scan(&token)
	if err != nil {
		return nil, err
	}
	if token == nil {
		return nil, fmt.Errorf("lock %s still taken after %v", lockID, wait)
	}
	lease := &Lease{LockID: lockID, Owner: owner, Token: *token, TTL: ttl}
	lease.ctx, lease.cancel = context.WithCancel(ctx)
	defer lease.cancel()
	stop, done := make(chan struct{}), make(chan struct{})
	go renew(lease, ttl/3, stop, done)

	workErr := work(lease)

	close(stop)
	<-done
	var released bool
	if conn.QueryRow(context.Background(), "SELECT lockext.lock_release($1, $2, $3)",
		lockID, owner, lease.Token).Scan(&released) == nil {
		lease.Released = &released
	}
	if workErr == nil {
		workErr = lease.Check()
	}
	return lease, workErr
}

// FencedWrite runs sql in one transaction that starts with lockext.fence(resource, token):
// if a newer token was fenced on resource, the transaction aborts and nothing is written.
func FencedWrite(ctx context.Context, conn *pgx.Conn, l *Lease, resource, sql string, args ...interface{}) error {
	err := conn.BeginFunc(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT lockext.fence($1, $2)", resource, l.Token); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sql, args...)
		return err
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55L01" {
		return fmt.Errorf("%w: %s", ErrStaleToken, pgErr.Message)
	}
	return err
}

func writeAccount(ctx context.Context, conn *pgx.Conn, l *Lease, account, writer string, delta int64) error {
	return FencedWrite(ctx, conn, l, "account:"+account,
		"UPDATE "+table+" SET balance = balance + $1, last_writer = $2, last_token = $3 WHERE id = $4",
		delta, writer, l.Token, account)
}

func setup(ctx context.Context, conn *pgx.Conn, account string) error {
	if _, err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+table+
		" (id text PRIMARY KEY, balance bigint NOT NULL, last_writer text, last_token bigint)"); err != nil {
		return err
	}
	_, err := conn.Exec(ctx, "INSERT INTO "+table+" (id, balance) VALUES ($1, 0)", account)
	return err
}

type account struct {
	balance int64
	writer  *string
	token   *int64
}

func readAccount(ctx context.Context, conn *pgx.Conn, id string) (a account, err error) {
	err = conn.QueryRow(ctx, "SELECT balance, last_writer, last_token FROM "+table+" WHERE id = $1", id).
		Scan(&a.balance, &a.writer, &a.token)
	return
}

func random() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func newOwner(role string) string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s:%d:%s:%s", host, os.Getpid(), role, random())
}

func runID() string { return fmt.Sprintf("%d-%s", os.Getpid(), random()) }

func str(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

func num(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// ---------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------

func scenarioWork(ctx context.Context) (bool, error) {
	rid := runID()
	acct := "work-" + rid
	conn, err := connect(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Close(ctx)
	if err := setup(ctx, conn, acct); err != nil {
		return false, err
	}
	lease, err := WithLock(ctx, "example:go:work:"+rid, newOwner("worker"), time.Second, 30*time.Second,
		func(l *Lease) error {
			for i := 0; i < 10; i++ { // 10 steps of 250 ms: 2.5 leases long
				if err := l.Check(); err != nil {
					return err
				}
				if err := writeAccount(ctx, conn, l, acct, "worker", 1); err != nil {
					return err
				}
				time.Sleep(250 * time.Millisecond)
			}
			return nil
		})
	if err != nil {
		return false, err
	}
	a, err := readAccount(ctx, conn, acct)
	if err != nil {
		return false, err
	}
	fmt.Printf("work:  10 fenced writes committed=%d, renewals=%d, released=%v\n", a.balance, lease.Renewals, *lease.Released)
	return a.balance == 10 && num(a.token) == lease.Token && lease.Renewals >= 3 && *lease.Released, nil
}

func scenarioLost(ctx context.Context) (bool, error) {
	rid := runID()
	acct, lockID := "lost-"+rid, "example:go:lost:"+rid
	conn, err := connect(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Close(ctx)
	operator, err := connect(ctx)
	if err != nil {
		return false, err
	}
	defer operator.Close(ctx)
	if err := setup(ctx, conn, acct); err != nil {
		return false, err
	}
	steps := 0
	lease, err := WithLock(ctx, lockID, newOwner("worker"), time.Second, 30*time.Second, func(l *Lease) error {
		for i := 0; i < 40; i++ { // would take 4 s
			if err := l.Check(); err != nil {
				return err
			}
			if err := writeAccount(ctx, conn, l, acct, "worker", 1); err != nil {
				return err
			}
			steps++
			if i == 2 { // an operator clears the lock (lockext_admin may do it for any holder)
				if _, err := operator.Exec(ctx, "SELECT lockext.lock_release($1, $2, $3)", lockID, l.Owner, l.Token); err != nil {
					return err
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		return nil
	})
	if err != nil && !errors.Is(err, ErrLeaseLost) {
		return false, err
	}
	a, rerr := readAccount(ctx, conn, acct)
	if rerr != nil {
		return false, rerr
	}
	fmt.Printf("lost:  work stopped after %d of 40 steps (%v); release returned %v\n", steps, err, *lease.Released)
	return errors.Is(err, ErrLeaseLost) && steps < 15 && a.balance == int64(steps) && !*lease.Released, nil
}

// pauseA: holder A writes once, says `ready`, blocks on stdin (it is frozen there), then
// writes again without checking the lease, like code that checked it just before the pause.
func pauseA(ctx context.Context, lockID, acct string) int {
	conn, err := connect(ctx)
	if err != nil {
		fmt.Println("error", err)
		return 2
	}
	defer conn.Close(ctx)
	lease, err := WithLock(ctx, lockID, newOwner("A"), time.Second, 30*time.Second, func(l *Lease) error {
		if err := l.Check(); err != nil {
			return err
		}
		if err := writeAccount(ctx, conn, l, acct, "A", 1); err != nil {
			return err
		}
		fmt.Printf("ready %d\n", l.Token)
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // `go` was written while we were stopped
		return writeAccount(ctx, conn, l, acct, "A", 1)
	})
	if errors.Is(err, ErrStaleToken) {
		fmt.Printf("stale write refused: %v\n", err)
		if lease.Released != nil && !*lease.Released {
			return 0
		}
		return 1
	}
	fmt.Printf("stale write ACCEPTED (%v)\n", err)
	return 1
}

// pauseB: holder B waits for the lock, writes, releases; prints its token.
func pauseB(ctx context.Context, lockID, acct string) int {
	conn, err := connect(ctx)
	if err != nil {
		fmt.Println("error", err)
		return 2
	}
	defer conn.Close(ctx)
	lease, err := WithLock(ctx, lockID, newOwner("B"), 5*time.Second, 10*time.Second, func(l *Lease) error {
		return writeAccount(ctx, conn, l, acct, "B", 100)
	})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Printf("wrote %d\n", lease.Token)
	return 0
}

// waitStopped returns once every thread of process pid is stopped (state T in
// /proc/PID/task/*/stat), or an error after `within`. kill(SIGSTOP) is not enough: it
// returns once the signal is queued, and the one thread woken to take it stops the others
// only when it gets to run; until then the rest of a multi-threaded process (a Go program
// has several threads) goes on, and could read and act on what we write to its stdin.
func waitStopped(pid int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		stopped, err := allThreadsStopped(pid)
		if err != nil || stopped {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d not stopped %v after SIGSTOP", pid, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func allThreadsStopped(pid int) (bool, error) {
	stats, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	live := 0
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // a thread that just exited
		}
		// "tid (comm) S ...": comm may hold spaces and ')', the state follows the last ')'.
		state := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(state) == 0 || state[0] == "Z" || state[0] == "X" {
			continue // dead: it will not run again
		}
		live++
		if state[0] != "T" {
			return false, nil
		}
	}
	if live == 0 {
		return false, fmt.Errorf("no live thread of process %d in /proc/%d/task: it exited (or this is not Linux)", pid, pid)
	}
	return true, nil
}

func scenarioPause(ctx context.Context) (bool, error) {
	rid := runID()
	acct, lockID := "pause-"+rid, "example:go:pause:"+rid
	conn, err := connect(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Close(ctx)
	if err := setup(ctx, conn, acct); err != nil {
		return false, err
	}
	self, err := os.Executable()
	if err != nil {
		return false, err
	}
	a := exec.Command(self, "pause-a", lockID, acct)
	a.Stderr = os.Stderr
	aIn, _ := a.StdinPipe()
	aOutPipe, _ := a.StdoutPipe()
	if err := a.Start(); err != nil {
		return false, err
	}
	defer func() { // never leave A stopped or running
		_ = a.Process.Signal(syscall.SIGCONT)
		_ = a.Process.Kill()
	}()
	aOut := bufio.NewReader(aOutPipe)
	ready, _ := aOut.ReadString('\n')
	aToken, err := strconv.ParseInt(strings.TrimPrefix(strings.TrimSpace(ready), "ready "), 10, 64)
	if err != nil {
		return false, fmt.Errorf("A said %q", ready)
	}
	_ = a.Process.Signal(syscall.SIGSTOP) // A, renewer included, is frozen past its 1 s lease
	if err := waitStopped(a.Process.Pid, 10*time.Second); err != nil {
		return false, fmt.Errorf("A: %w", err)
	}
	_, _ = aIn.Write([]byte("go\n")) // A reads it only once resumed
	b := exec.Command(self, "pause-b", lockID, acct)
	b.Stderr = os.Stderr
	bOut, bErr := b.Output()
	var bToken int64
	if bErr == nil {
		bToken, _ = strconv.ParseInt(strings.TrimPrefix(strings.TrimSpace(string(bOut)), "wrote "), 10, 64)
	}
	_ = a.Process.Signal(syscall.SIGCONT)
	aSaid, _ := aOut.ReadString('\n')
	aErr := a.Wait()
	acc, err := readAccount(ctx, conn, acct)
	if err != nil {
		return false, err
	}
	fmt.Printf("pause: A token %d; B token %d; A after resuming: %s\n", aToken, bToken, strings.TrimSpace(aSaid))
	fmt.Printf("       account: balance=%d last_writer=%s last_token=%d\n", acc.balance, str(acc.writer), num(acc.token))
	return aErr == nil && bErr == nil && bToken > aToken &&
		acc.balance == 101 && str(acc.writer) == "B" && num(acc.token) == bToken, nil
}

func main() {
	ctx := context.Background()
	mode := "all"
	if len(os.Args) > 1 {
		mode = os.Args[1]
	}
	switch mode {
	case "pause-a":
		os.Exit(pauseA(ctx, os.Args[2], os.Args[3]))
	case "pause-b":
		os.Exit(pauseB(ctx, os.Args[2], os.Args[3]))
	}
	scenarios := map[string]func(context.Context) (bool, error){
		"work": scenarioWork, "lost": scenarioLost, "pause": scenarioPause,
	}
	names := []string{"work", "lost", "pause"}
	if mode != "all" {
		names = []string{mode}
	}
	failed := 0
	for _, name := range names {
		run, known := scenarios[name]
		if !known {
			fmt.Fprintf(os.Stderr, "unknown scenario %s\n", name)
			os.Exit(2)
		}
		ok, err := run(ctx)
		if err != nil {
			fmt.Printf("%s: error: %v\n", name, err)
		}
		if !ok {
			failed++
		}
	}
	fmt.Printf("go: %d passed, %d failed\n", len(names)-failed, failed)
	if failed > 0 {
		os.Exit(1)
	}
}
