package apiserver

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/waggle-io/waggle/controlplane/storage"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// serveWatch streams watch events as newline-separated JSON frames
// ({"type":..., "object":...}). Objects come pre-encoded from the watch
// cache: a frame is the event type around bytes shared by every watcher.
func (s *Server) serveWatch(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request) error {
	opts, err := listOptions(r, req.reg)
	if err != nil {
		return err
	}
	pred, err := req.reg.predicate(req.ns, opts)
	if err != nil {
		return err
	}
	var from int64
	switch opts.ResourceVersion {
	case "", "0":
	default:
		if from, err = strconv.ParseInt(opts.ResourceVersion, 10, 64); err != nil || from < 0 {
			return apierrors.NewBadRequest("invalid resourceVersion " + strconv.Quote(opts.ResourceVersion))
		}
	}
	timeout := time.Duration(30+rand.IntN(30)) * time.Minute
	if opts.TimeoutSeconds != nil {
		timeout = time.Duration(*opts.TimeoutSeconds) * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	wctx, wcancel := context.WithTimeout(ctx, tooLargeRVWait)
	var watcher *storage.Watcher
	if opts.SendInitialEvents != nil {
		// Streaming list (WatchList, client-go's default): the state at
		// least as new as resourceVersion (unset: consistent with etcd
		// now) as ADDED events, a bookmark marking their end, then changes;
		// sendInitialEvents=false: only changes after that state.
		minRev := from
		if opts.ResourceVersion == "" {
			if minRev, err = s.store.Revision(wctx); err != nil {
				wcancel()
				return err
			}
		}
		if *opts.SendInitialEvents {
			watcher, err = req.reg.cache.WatchList(wctx, minRev, pred)
		} else {
			watcher, err = req.reg.cache.WatchFromNow(wctx, minRev, pred)
		}
		from = minRev
	} else {
		if opts.ResourceVersion == "" {
			// Unset: the current state as of now, consistently.
			if rev, err := s.store.Revision(wctx); err == nil {
				_, _, err = req.reg.cache.List(wctx, rev, storage.Predicate{KeyPrefix: "\x00"})
			}
		}
		watcher, err = req.reg.cache.Watch(wctx, from, pred)
	}
	wcancel()
	if err != nil && errors.Is(err, storage.ErrUnavailable) && from > 0 && ctx.Err() == nil {
		if tl := req.reg.tooLargeRV(ctx, from); tl != nil {
			return tl
		}
	}

	table := wantsTable(r)
	partial := wantsPartial(r)
	pb := wantsProtobuf(r) && !table && !partial
	if pb {
		w.Header().Set("Content-Type", protobufType+";stream=watch")
	} else {
		w.Header().Set("Content-Type", "application/json")
	}
	w.Header().Set("Cache-Control", "no-cache")
	var ce *storage.CompactedError
	if errors.As(err, &ce) {
		// Older than the cache's window: resume from etcd itself, which
		// answers 410 only if the revision is compacted there too.
		watcher, err = req.reg.cache.WatchFromStore(ctx, from, pred), nil
	}
	if err != nil {
		return err
	}
	defer watcher.Stop()
	rc := http.NewResponseController(w)
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return nil
	}

	bookmarks := opts.AllowWatchBookmarks
	bookmarkPrefix := []byte(`{"type":"BOOKMARK","object":{"kind":"` + req.reg.res.Kind + `","apiVersion":"` + req.reg.res.GroupVersion().String() + `","metadata":{"resourceVersion":"`)
	buf := make([]byte, 0, 64<<10)
	headers := true
	go func() {
		select {
		case <-s.watchStop:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		e, t, err := watcher.Next(ctx, len(buf) == 0)
		if err != nil {
			if len(buf) > 0 {
				w.Write(buf)
				rc.Flush()
			}
			if errors.As(err, &ce) {
				// As kube-apiserver: the stream carries a 410 ERROR event.
				if pb {
					writeProtobufErrorEvent(w, statusFor(err, req.reg.gr, ""))
				} else {
					writeErrorEvent(w, statusFor(err, req.reg.gr, ""))
				}
			}
			return nil // timeout, shutdown, client gone or closed as slow: end cleanly
		}
		if e == nil {
			// Nothing more queued: send what we have.
			if _, err := w.Write(buf); err != nil {
				return nil
			}
			if err := rc.Flush(); err != nil {
				return nil
			}
			buf = buf[:0]
			continue
		}
		switch {
		case pb:
			if t == watch.Bookmark && !bookmarks {
				continue
			}
			var raw []byte
			if t == watch.Bookmark {
				bm := req.reg.res.New()
				objectMeta(bm).SetResourceVersion(strconv.FormatInt(e.Rev, 10))
				if e.InitialEventsEnd {
					objectMeta(bm).SetAnnotations(map[string]string{metav1.InitialEventsAnnotationKey: "true"})
				}
				bm.GetObjectKind().SetGroupVersionKind(req.reg.res.GroupVersionKind())
				raw, err = encodeProtobuf(bm)
			} else {
				raw, err = e.Obj.Alternate(encodeProtobuf)
			}
			if err != nil {
				return nil
			}
			if buf, err = appendProtobufFrame(buf, t, raw); err != nil {
				return nil
			}
		case t == watch.Bookmark:
			if !bookmarks {
				continue
			}
			buf = append(buf, bookmarkPrefix...)
			buf = strconv.AppendInt(buf, e.Rev, 10)
			if e.InitialEventsEnd {
				buf = append(buf, `","annotations":{"`+metav1.InitialEventsAnnotationKey+`":"true"}}}}`+"\n"...)
			} else {
				buf = append(buf, "\"}}}\n"...)
			}
		case partial:
			pj, err := json.Marshal(partialOf(e.Obj.Obj))
			if err != nil {
				return nil
			}
			buf = appendFrame(buf, t, pj)
		case table:
			tbl, err := req.reg.table(r, e.Obj.Obj, !headers)
			if errors.Is(err, errNoTable) {
				j, err := e.Obj.EncodedJSON()
				if err != nil {
					return nil
				}
				buf = appendFrame(buf, t, j)
				break
			}
			if err != nil {
				writeErrorEvent(w, apierrors.NewInternalError(err))
				return nil
			}
			headers = false
			tbl.ResourceVersion = strconv.FormatInt(e.Rev, 10)
			tbl.Kind, tbl.APIVersion = "Table", "meta.k8s.io/v1"
			tj, err := json.Marshal(tbl)
			if err != nil {
				return nil
			}
			buf = appendFrame(buf, t, tj)
		default:
			j, err := e.Obj.EncodedJSON()
			if err != nil {
				return nil
			}
			buf = appendFrame(buf, t, j)
		}
		if len(buf) > 256<<10 {
			if _, err := w.Write(buf); err != nil {
				return nil
			}
			buf = buf[:0]
		}
	}
}

func appendFrame(buf []byte, t watch.EventType, obj []byte) []byte {
	buf = append(buf, `{"type":"`...)
	buf = append(buf, t...)
	buf = append(buf, `","object":`...)
	buf = append(buf, obj...)
	return append(buf, "}\n"...)
}

func writeErrorEvent(w http.ResponseWriter, se *apierrors.StatusError) {
	st := se.ErrStatus
	st.Kind, st.APIVersion = "Status", "v1"
	if st.Status == "" {
		st.Status = metav1.StatusFailure
	}
	b, _ := json.Marshal(&st)
	w.Write(appendFrame(nil, watch.Error, b))
	http.NewResponseController(w).Flush()
}

func encodeProtobuf(obj runtime.Object) ([]byte, error) {
	var b bytes.Buffer
	if err := protobufCodec.Encode(obj, &b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// appendProtobufFrame appends one frame of a protobuf watch stream: a 4-byte
// big-endian length, then a metav1.WatchEvent whose object is the
// envelope-encoded object (what client-go's protobuf stream decoder reads).
func appendProtobufFrame(buf []byte, t watch.EventType, obj []byte) ([]byte, error) {
	ev := metav1.WatchEvent{Type: string(t), Object: runtime.RawExtension{Raw: obj}}
	b, err := ev.Marshal()
	if err != nil {
		return buf, err
	}
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(b)))
	return append(buf, b...), nil
}

func writeProtobufErrorEvent(w http.ResponseWriter, se *apierrors.StatusError) {
	st := se.ErrStatus
	st.Kind, st.APIVersion = "Status", "v1"
	if st.Status == "" {
		st.Status = metav1.StatusFailure
	}
	raw, err := encodeProtobuf(&st)
	if err != nil {
		return
	}
	if b, err := appendProtobufFrame(nil, watch.Error, raw); err == nil {
		w.Write(b)
		http.NewResponseController(w).Flush()
	}
}
