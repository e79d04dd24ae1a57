package report

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// IsTerminal reports whether w is an *os.File attached to a character
// device (a terminal).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok || f == nil {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// Progress is a one-line progress bar redrawn in place with \r. It draws
// only when its writer is a terminal (see NewProgress); otherwise every
// method is a no-op. Safe for concurrent use. It starts no goroutine: it
// redraws from Add, at most every 100ms.
type Progress struct {
	mu    sync.Mutex // guards all fields below
	w     io.Writer  // nil = disabled
	label string
	total int
	done  int
	start time.Time
	last  time.Time
	now   func() time.Time
}

// NewProgress returns a progress bar for total steps labelled label,
// drawing on w only if w is a terminal.
func NewProgress(w io.Writer, total int, label string) *Progress {
	if !IsTerminal(w) {
		w = nil
	}
	return newProgress(w, total, label, time.Now)
}

func newProgress(w io.Writer, total int, label string, now func() time.Time) *Progress {
	return &Progress{w: w, total: total, label: label, start: now(), now: now}
}

// Add advances the bar by n steps.
func (p *Progress) Add(n int) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done += n
	if p.w == nil {
		return
	}
	t := p.now()
	if t.Sub(p.last) < 100*time.Millisecond && p.done < p.total {
		return
	}
	p.last = t
	p.draw(t)
}

// Finish draws the final state and ends the line.
func (p *Progress) Finish() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.w == nil {
		return
	}
	p.draw(p.now())
	fmt.Fprintln(p.w)
	p.w = nil
}

func (p *Progress) draw(t time.Time) {
	const width = 30
	frac := 0.0
	if p.total > 0 {
		frac = min(1, float64(p.done)/float64(p.total))
	}
	fill := int(frac * width)
	el := t.Sub(p.start).Truncate(100 * time.Millisecond)
	fmt.Fprintf(p.w, "\r%s [%s%s] %d/%d %3.0f%% %v ", p.label, strings.Repeat("=", fill),
		strings.Repeat(" ", width-fill), p.done, p.total, 100*frac, el)
}
