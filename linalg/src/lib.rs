//! rankwise linalg.
