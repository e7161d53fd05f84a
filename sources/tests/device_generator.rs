//! The device kernels that generate matrices reproduce the CPU generator bit for bit:
//! checked on the host CPU, through the device crate's host build of `kernels.cu` (see
//! `rankwise_device::host`), so that `make test` checks them where no GPU is present.

use rankwise_device::host::{Guarded, HostArgs, HostKernels};
use rankwise_sources::stream::{self, BLOCK_COLS, LANES};
use rankwise_sources::{Dist, Generated};
use rankwise_testkit::Draw;

fn kernels() -> &'static HostKernels {
    HostKernels::get().unwrap_or_else(|e| panic!("{e}"))
}

/// Fresh rows and column ranges of the generated uniform matrix, from grids whose
/// blocks are smaller than the rows (rows are strided) and columns that start and end
/// inside 256-column blocks: the kernels' values are the CPU generator's, bit for bit,
/// and the padding of each row past its columns is left alone.
#[test]
fn uniform_kernels_are_the_cpu_generator() {
    let k = kernels();
    let mut d = Draw::fresh();
    for round in 0..6 {
        let key = d.next();
        let row0 = d.below(1 << 30);
        let col0 = d.below(3 * BLOCK_COLS as u64);
        let h = 1 + d.below(7) as u32;
        let w = 1 + d.below(700) as u32;
        let ld = w + d.below(5) as u32;
        let blocks = (col0 + w as u64).div_ceil(BLOCK_COLS as u64) - col0 / BLOCK_COLS as u64;
        let threads = [32u32, 64, 256][round % 3];
        let grid_x = ((blocks * LANES as u64) as u32).div_ceil(threads);
        let grid_y = 1 + d.below(h as u64) as u32;
        let what = format!("round {round}: rows {row0}+{h}, columns {col0}+{w}, ld {ld}");
        let mut f64s = Guarded::<f64>::zeroed((h * ld) as usize);
        let mut f32s = Guarded::<f32>::zeroed((h * ld) as usize);
        f64s.values_mut().fill(-7.0);
        f32s.values_mut().fill(-7.0);
        for (name, out) in [("uniform_f64", 0), ("uniform_f32", 1)] {
            let mut a = HostArgs::new();
            if out == 0 {
                a.buffer(f64s.values_mut());
            } else {
                a.buffer(f32s.values_mut());
            }
            a.value(key)
                .value(row0)
                .value(col0)
                .value(h)
                .value(w)
                .value(ld);
            k.launch(name, (grid_x, grid_y, 1), (threads, 1, 1), &mut a)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
        }
        f64s.check(&what).unwrap();
        f32s.check(&what).unwrap();
        let mut want = vec![0f64; w as usize];
        let mut want32 = vec![0f32; w as usize];
        for i in 0..h as usize {
            stream::uniform_row(key, row0 + i as u64, col0, &mut want);
            stream::uniform_row_f32(key, row0 + i as u64, col0, &mut want32);
            let row = &f64s.values()[i * ld as usize..(i + 1) * ld as usize];
            let row32 = &f32s.values()[i * ld as usize..(i + 1) * ld as usize];
            for j in 0..w as usize {
                assert_eq!(
                    row[j].to_bits(),
                    want[j].to_bits(),
                    "{what}: ({i}, {j}) f64"
                );
                assert_eq!(
                    row32[j].to_bits(),
                    want32[j].to_bits(),
                    "{what}: ({i}, {j}) f32"
                );
            }
            assert!(
                row[w as usize..].iter().all(|&v| v == -7.0),
                "{what}: padding"
            );
            assert!(
                row32[w as usize..].iter().all(|&v| v == -7.0),
                "{what}: padding"
            );
        }
    }
}

/// Generated genotypes of fresh shapes, with and without population structure and
/// missing calls: the kernel's packed codes are the CPU's `fill_packed_rows`, byte for
/// byte, and its per-variant counts of each code are the CPU's counts.
#[test]
fn genotype_kernel_packs_the_cpu_codes_and_counts_them() {
    let k = kernels();
    let mut d = Draw::fresh();
    for round in 0..8 {
        let n = 1 + d.below(1500);
        let h = 1 + d.below(9);
        let pops = 1 + d.below(4.min(n));
        let missing = if round % 2 == 0 { 0.0 } else { 0.07 };
        let g = Generated::new(h + 40, n, d.next(), Dist::Genotype)
            .with_populations(pops, 0.2)
            .unwrap()
            .with_missing(missing);
        let row0 = d.below(40);
        let what = format!("round {round}: {h} variants from {row0}, {n} samples, {pops} populations, missing {missing}");
        let stride = n.div_ceil(4) as usize;
        let ld = stride + d.below(3) as usize;
        let mut thresholds = Vec::new();
        g.genotype_thresholds(row0..row0 + h, &mut thresholds);
        let mut packed = Guarded::<u8>::zeroed(h as usize * ld);
        packed.values_mut().fill(0xEE);
        let mut counts = Guarded::<u32>::zeroed(4 * h as usize);
        let blocks = n.div_ceil(BLOCK_COLS as u64) as u32;
        let threads = [32u32, 256][round % 2];
        let grid = (blocks.div_ceil(threads), 1 + d.below(h) as u32, 1);
        {
            let mut a = HostArgs::new();
            a.buffer(packed.values_mut())
                .buffer(counts.values_mut())
                .input(&thresholds)
                .value(g.key())
                .value(row0)
                .value(h as u32)
                .value(n as u32)
                .value(pops as u32)
                .value(g.missing_threshold())
                .value(ld as u32);
            k.launch("genotype_packed", grid, (threads, 1, 1), &mut a)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
        }
        packed.check(&what).unwrap();
        counts.check(&what).unwrap();
        let mut want = vec![0u8; h as usize * stride];
        let mut want_counts = Vec::new();
        g.fill_packed_rows(row0..row0 + h, &mut want, stride, &mut want_counts);
        for i in 0..h as usize {
            let row = &packed.values()[i * ld..(i + 1) * ld];
            assert_eq!(
                &row[..stride],
                &want[i * stride..(i + 1) * stride],
                "{what}: variant {i}"
            );
            assert!(
                row[stride..].iter().all(|&b| b == 0xEE),
                "{what}: variant {i} padding"
            );
            let c = &counts.values()[4 * i..4 * i + 4];
            let [c1, c2, c3] = want_counts[i];
            assert_eq!(
                [c[0] as u64, c[1] as u64, c[2] as u64, c[3] as u64],
                [n - c1 - c2 - c3, c1, c2, c3],
                "{what}: counts of variant {i}"
            );
        }
    }
}
