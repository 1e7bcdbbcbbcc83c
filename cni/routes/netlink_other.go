//go:build !linux

package routes

// NewNetlink returns a Dataplane whose every call fails with ErrNotSupported.
func NewNetlink() Dataplane { return unsupported{} }

type unsupported struct{}

func (unsupported) Routes() ([]Route, error)              { return nil, ErrNotSupported }
func (unsupported) ReplaceRoute(Route) error              { return ErrNotSupported }
func (unsupported) DeleteRoute(Route) error               { return ErrNotSupported }
func (unsupported) EnsureVXLAN(VXLANDevice) error         { return ErrNotSupported }
func (unsupported) DeleteLink(string) error               { return ErrNotSupported }
func (unsupported) Neighbors(string) ([]Neighbor, error)  { return nil, ErrNotSupported }
func (unsupported) SetNeighbor(string, Neighbor) error    { return ErrNotSupported }
func (unsupported) DeleteNeighbor(string, Neighbor) error { return ErrNotSupported }
func (unsupported) FDB(string) ([]FDBEntry, error)        { return nil, ErrNotSupported }
func (unsupported) SetFDB(string, FDBEntry) error         { return ErrNotSupported }
func (unsupported) DeleteFDB(string, FDBEntry) error      { return ErrNotSupported }
