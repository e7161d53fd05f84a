//! rankwise runtime.
