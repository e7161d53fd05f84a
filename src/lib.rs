//! rankwise: distributed SVD and PCA of matrices too large for one machine.
