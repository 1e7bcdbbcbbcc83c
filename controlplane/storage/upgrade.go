package storage

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/bbolt"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.etcd.io/etcd/server/v3/storage/schema"
	"go.uber.org/zap/zapcore"
)

// upgradeFrom35 moves an embedded etcd data dir written by etcd 3.5 (Waggle
// before the move to etcd 3.7) to the current format.
//
// etcd upgrades one minor version at a time, and etcd 3.7 cannot replay a
// 3.5 write-ahead log (it panics applying its entries). The keyspace in the
// backend database is compatible, so the member is rebuilt from it the way
// `etcdutl snapshot restore` does: the old directory is kept beside the new
// one as <dir>.etcd35-<time>, and revisions are kept, so clients'
// resourceVersions stay valid. Writes that a 3.5 member had in its log but
// not yet in its database (at most the last ~100 ms before a crash) are not
// carried over: stop the old Waggle cleanly before upgrading.
//
// dir is the member's data dir (holding member/). A dir without a database,
// or whose database records a storage version (written by etcd 3.6 or
// later), is left alone.
func upgradeFrom35(dir, name, peerURL string, log *slog.Logger) error {
	db := filepath.Join(dir, "member", "snap", "db")
	if _, err := os.Stat(db); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	old, err := storageVersion(db)
	if err != nil {
		return fmt.Errorf("read the storage version of %s: %w", db, err)
	}
	if old {
		return nil
	}
	backup := fmt.Sprintf("%s.etcd35-%s", dir, time.Now().UTC().Format("20060102T150405Z"))
	log.Warn("upgrading an etcd 3.5 data dir: rebuilding the member from its database", "dir", dir, "backup", backup)
	if err := os.Rename(dir, backup); err != nil {
		return fmt.Errorf("keep the etcd 3.5 data dir as %s: %w", backup, err)
	}
	err = snapshot.NewV3(etcdLogger(log, "etcd-upgrade", zapcore.WarnLevel)).Restore(snapshot.RestoreConfig{
		SnapshotPath:        filepath.Join(backup, "member", "snap", "db"),
		Name:                name,
		OutputDataDir:       dir,
		PeerURLs:            []string{peerURL},
		InitialCluster:      name + "=" + peerURL,
		InitialClusterToken: "etcd-cluster", // embed's default, which StartEmbedded keeps
		SkipHashCheck:       true,           // a data dir's database carries no snapshot hash
	})
	if err != nil {
		os.RemoveAll(dir)
		if rerr := os.Rename(backup, dir); rerr != nil {
			return fmt.Errorf("upgrade etcd 3.5 data dir %s: %w (and putting it back failed: %v; it is in %s)", dir, err, rerr, backup)
		}
		return fmt.Errorf("upgrade etcd 3.5 data dir %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	log.Info("etcd 3.5 data dir upgraded", "dir", dir, "backup", backup)
	return nil
}

// storageVersion reports whether the backend database at path records a
// storage version, as etcd 3.6 and later write; 3.5 wrote none.
func storageVersion(path string) (bool, error) {
	b, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		return false, err
	}
	defer b.Close()
	var has bool
	err = b.View(func(tx *bbolt.Tx) error {
		has = schema.ReadStorageVersionFromSnapshot(tx) != nil
		return nil
	})
	return has, err
}
