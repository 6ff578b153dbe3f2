// Package lockedbuf is a bytes.Buffer that several goroutines may write at
// once: the tests give one to a server's logger and read what it logged.
package lockedbuf

import (
	"bytes"
	"sync"
)

// Buffer is safe for concurrent use. The zero value is empty and ready.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
