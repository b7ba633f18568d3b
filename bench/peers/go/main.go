// Go peer of Jackdaw's scheduler benchmark (bench/sched.c).
//
// Role: run one of the eight scheduler shapes of docs/performance.md with goroutines and
// channels under GOMAXPROCS=W and print its per-iteration times, so
// bench/compare.sh can put Go beside Jackdaw and Tokio.
//
// Protocol (shared by all three programs):
//
//	jd-peer-go --shape NAME --iters N --workers W --raw
//
// sets GOMAXPROCS=W, runs one uncounted warm-up iteration, then N timed
// iterations, and prints exactly one line
//
//	RESULT shape=NAME iters=N samples_ns=v1,...,vN rss_kb=K
//
// where K is the peak RSS of the process (getrusage ru_maxrss). Without --raw
// it prints a human summary (median, min, p90) instead.
//
// Invariants: every iteration is timed by the main goroutine from its first
// spawn until it receives the signal that the shape's work is complete (a
// latch: an atomic counter whose last decrement closes a channel). Go has no
// thread outside its Ps that could spawn "remotely": the remote shapes spawn
// from the main goroutine, which is itself scheduled on one of the W Ps, and
// their goroutines go to that P's run queue. That is the closest Go has and
// is reported as such in bench/RESULTS.md.
//
// Threading: the main goroutine times; benchmark goroutines run on any P.
// The process exits with os.Exit, so busy goroutines cannot delay it.
package main

import (
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	numSpawn      = 10000 // spawns per spawn_many_* iteration, as Tokio's bench
	numSpawnBusy2 = 1000  // busy2 spawns fewer: each may wait behind a 10 us stall
	numPings      = 1000  // ping_pong rounds: 2 spawns + 2 wakes each
	yieldTasks    = 200   // yield_many goroutines...
	numYield      = 1000  // ...each yielding this many times
	chainDepth    = 1000  // chained_spawn depth
	skynetLeaves  = 1000000
	skynetAnswer  = 499999500000 // sum of 0..10^6-1
	stallDur      = 10 * time.Microsecond
)

var shapes = []string{
	"spawn_many_local",
	"spawn_many_remote_idle",
	"spawn_many_remote_busy1",
	"spawn_many_remote_busy2",
	"ping_pong",
	"yield_many",
	"chained_spawn",
	"skynet",
}

// latch counts down from n; the goroutine that reaches zero closes done.
type latch struct {
	remaining atomic.Int64
	done      chan struct{}
}

func newLatch(n int) *latch {
	l := &latch{done: make(chan struct{})}
	l.remaining.Store(int64(n))
	return l
}

// arrive is called once per unit of work from any goroutine. Go's atomics
// are sequentially consistent, so the closer sees every earlier arrival.
func (l *latch) arrive() {
	if l.remaining.Add(-1) == 0 {
		close(l.done)
	}
}

func (l *latch) wait() { <-l.done }

// stall busy-waits for stallDur without yielding the P.
func stall() {
	start := time.Now()
	for time.Since(start) < stallDur {
	}
}

// measure runs iter once as warm-up, then iters timed times.
func measure(iters int, iter func()) []int64 {
	iter()
	samples := make([]int64, iters)
	for i := range samples {
		start := time.Now()
		iter()
		samples[i] = int64(time.Since(start))
	}
	return samples
}

// spawnFromMain spawns n empty goroutines from the main goroutine and waits.
func spawnFromMain(n int) {
	l := newLatch(n)
	for i := 0; i < n; i++ {
		go l.arrive()
	}
	l.wait()
}

func spawnManyLocal(iters int) []int64 {
	return measure(iters, func() {
		l := newLatch(numSpawn)
		// The spawner is itself a goroutine, as in the other peers.
		go func() {
			for i := 0; i < numSpawn; i++ {
				go l.arrive()
			}
		}()
		l.wait()
	})
}

func spawnManyRemoteIdle(iters int) []int64 {
	return measure(iters, func() { spawnFromMain(numSpawn) })
}

func spawnManyRemoteBusy1(workers, iters int) []int64 {
	var stop atomic.Bool
	for i := 0; i < 2*workers; i++ {
		go func() {
			for !stop.Load() {
				runtime.Gosched()
				stall()
			}
		}()
	}
	samples := measure(iters, func() { spawnFromMain(numSpawn) })
	stop.Store(true)
	return samples
}

// busyChain is one link of a busy2 chain: stall, then respawn the next link
// for as long as stop is unset.
func busyChain(stop *atomic.Bool) {
	go func() {
		if !stop.Load() {
			stall()
			busyChain(stop)
		}
	}()
}

func spawnManyRemoteBusy2(workers, iters int) []int64 {
	var stop atomic.Bool
	for i := 0; i < workers; i++ {
		busyChain(&stop)
	}
	samples := measure(iters, func() { spawnFromMain(numSpawnBusy2) })
	stop.Store(true)
	return samples
}

func pingPong(iters int) []int64 {
	return measure(iters, func() {
		l := newLatch(numPings)
		go func() {
			for i := 0; i < numPings; i++ {
				// A: spawns B, messages it, waits for B's reply.
				go func() {
					toB := make(chan struct{}, 1)
					toA := make(chan struct{}, 1)
					go func() {
						<-toB
						toA <- struct{}{}
					}()
					toB <- struct{}{}
					<-toA
					l.arrive()
				}()
			}
		}()
		l.wait()
	})
}

func yieldMany(iters int) []int64 {
	return measure(iters, func() {
		l := newLatch(yieldTasks)
		for i := 0; i < yieldTasks; i++ {
			go func() {
				for j := 0; j < numYield; j++ {
					runtime.Gosched()
				}
				l.arrive()
			}()
		}
		l.wait()
	})
}

// chainLink spawns the next link until the chain is chainDepth deep.
func chainLink(l *latch, n int) {
	if n == 0 {
		l.arrive()
		return
	}
	go chainLink(l, n-1)
}

func chainedSpawn(iters int) []int64 {
	return measure(iters, func() {
		l := newLatch(1)
		go chainLink(l, chainDepth)
		l.wait()
	})
}

// skynetNode covers leaves [num, num+size): a leaf sends its number to the
// parent; an inner node spawns 10 children, sums their 10 messages and sends
// the sum up.
func skynetNode(parent chan<- int64, num, size int64) {
	if size == 1 {
		parent <- num
		return
	}
	rc := make(chan int64, 10)
	sub := size / 10
	for i := int64(0); i < 10; i++ {
		go skynetNode(rc, num+i*sub, sub)
	}
	var sum int64
	for i := 0; i < 10; i++ {
		sum += <-rc
	}
	parent <- sum
}

func skynet(iters int) []int64 {
	return measure(iters, func() {
		done := make(chan int64, 1)
		go skynetNode(done, 0, skynetLeaves)
		if sum := <-done; sum != skynetAnswer {
			fmt.Fprintf(os.Stderr, "skynet: wrong answer %d (want %d)\n", sum, int64(skynetAnswer))
			os.Exit(1)
		}
	})
}

// peakRSSKiB is ru_maxrss of this process (KiB on Linux), -1 on error.
func peakRSSKiB() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return ru.Maxrss
}

// resultLine formats the protocol line compare.sh parses.
func resultLine(shape string, samples []int64, rssKiB int64) string {
	parts := make([]string, len(samples))
	for i, v := range samples {
		parts[i] = strconv.FormatInt(v, 10)
	}
	return fmt.Sprintf("RESULT shape=%s iters=%d samples_ns=%s rss_kb=%d",
		shape, len(samples), strings.Join(parts, ","), rssKiB)
}

func usage() {
	fmt.Fprintf(os.Stderr, "usage: jd-peer-go --shape NAME --iters N --workers W [--raw]\nshapes: %s\n",
		strings.Join(shapes, " "))
	os.Exit(2)
}

func positive(args []string, i int) int {
	if i >= len(args) {
		usage()
	}
	n, err := strconv.Atoi(args[i])
	if err != nil || n <= 0 {
		usage()
	}
	return n
}

func main() {
	shape, iters, workers, raw := "", 10, 2, false
	args := os.Args[1:]
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "--shape":
			i++
			if i >= len(args) {
				usage()
			}
			shape = args[i]
		case "--iters":
			i++
			iters = positive(args, i)
		case "--workers":
			i++
			workers = positive(args, i)
		case "--raw":
			raw = true
		default:
			usage()
		}
	}
	runtime.GOMAXPROCS(workers)

	var samples []int64
	switch shape {
	case "spawn_many_local":
		samples = spawnManyLocal(iters)
	case "spawn_many_remote_idle":
		samples = spawnManyRemoteIdle(iters)
	case "spawn_many_remote_busy1":
		samples = spawnManyRemoteBusy1(workers, iters)
	case "spawn_many_remote_busy2":
		samples = spawnManyRemoteBusy2(workers, iters)
	case "ping_pong":
		samples = pingPong(iters)
	case "yield_many":
		samples = yieldMany(iters)
	case "chained_spawn":
		samples = chainedSpawn(iters)
	case "skynet":
		samples = skynet(iters)
	default:
		usage()
	}
	rss := peakRSSKiB()

	if raw {
		fmt.Println(resultLine(shape, samples, rss))
	} else {
		sort.Slice(samples, func(a, b int) bool { return samples[a] < samples[b] })
		n := len(samples)
		p90 := samples[(n*9+9)/10-1]
		fmt.Printf("go    %-24s median %12d ns  min %12d ns  p90 %12d ns  rss %d KiB\n",
			shape, samples[n/2], samples[0], p90, rss)
	}
	os.Exit(0)
}
