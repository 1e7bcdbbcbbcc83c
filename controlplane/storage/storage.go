// Package storage is the API server's persistence layer on etcd v3: a store
// after etcd's client/v3/kubernetes interface (Get, List, Count,
// OptimisticPut, OptimisticDelete, each with revisions and a timeout on every
// call, plus Watch), an embedded single-member etcd for one machine, and the
// watch cache that serves LIST at resourceVersion=0 from memory and fans one
// etcd watch per resource out to every watcher.
//
// It stores opaque values under keys; it does not know Kubernetes types. The
// API server gives the watch cache a Codec that decodes values into objects,
// and does validation, defaulting and encoding itself.
package storage

import (
	"errors"
	"fmt"
)

// Sentinel errors. Callers map them to Kubernetes Status reasons.
var (
	// ErrNotFound: the key does not exist.
	ErrNotFound = errors.New("not found")
	// ErrExists: a create found the key already there.
	ErrExists = errors.New("already exists")
	// ErrConflict: the key was modified since the expected revision.
	ErrConflict = errors.New("conflict: the object has been modified")
	// ErrCompacted: the requested revision has been compacted away (410 Gone/Expired).
	ErrCompacted = errors.New("requested revision has been compacted")
	// ErrTooLarge: the value exceeds what the store accepts.
	ErrTooLarge = errors.New("value too large")
	// ErrUnavailable: the store cannot be reached in time.
	ErrUnavailable = errors.New("storage unavailable")
	// ErrWatchClosed: a watcher was closed by the cache (too slow, or the
	// cache is restarting); the client resumes from its last revision.
	ErrWatchClosed = errors.New("watch closed")
)

// KV is one stored key-value pair with its revisions.
type KV struct {
	Key            string
	Value          []byte
	ModRevision    int64
	CreateRevision int64
	// Stale is set when Value was decrypted with a key that is no longer
	// the first of the encryption configuration: the next update rewrites
	// it even when nothing else changed.
	Stale bool
}

// CompactedError carries the revision up to which history is gone.
type CompactedError struct {
	Requested, Compacted int64
}

func (e *CompactedError) Error() string {
	return fmt.Sprintf("revision %d is older than the oldest available (%d)", e.Requested, e.Compacted)
}

// Unwrap makes errors.Is(err, ErrCompacted) true.
func (e *CompactedError) Unwrap() error { return ErrCompacted }
