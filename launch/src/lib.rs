//! rankwise launch.
