"""The sweep behind kernels/_flash_attention.py's candidate tiles (GPU only; not part of the pipeline).

    PYTHONPATH=.:workflow python workflow/scripts/tune_flash.py out.csv

For each (head dim, causal, length) at bf16, batch x seq = 16384 tokens, 16 heads, it tunes every kernel
over a wider tile list than the defaults (each tile timed by the project's own tuner: median of a CUDA
graph replay), then times the tuned forward and forward+backward beside SDPA's cuDNN backend. Also
prints the per-call time of flash_attention and SDPA on a 16-token problem. One CSV row per measurement.

The warp-specialized TMA forward ('/ws' tiles), measured on the H200 (torch 2.11, triton 3.6, bf16, 16
heads, batch x seq = 16384, forward TFLOP/s, do_bench medians; pointer kernel = 128x64/w8/s3):
- kept: 128x128/w4/s2/ws at head_dim 128 without a causal mask, 529-560 against 485 for the pointer
  kernel and 616-624 for cuDNN (S = 4096 and 16384); the log-sum-exp is stored through a descriptor as
  (seq, 4) rows, because a plain store after the warp-specialized loop came back wrong (errors of 8-21
  in log2 units) with or without a mask, unpadded or padded, 1-D or 2-D.
- not kept: head_dim 64 (390-429 against 410-414); causal (the rows' mask is wrong in the specialized
  loop, errors up to 3.1, and it ran at 238-433 against 350-475); 128x64/w4/s3 and 128x128/w4/s3 at
  head_dim 64 (NaN); 128x128/w4/s3 at head_dim 128 (262680 B of shared memory, over the 232448 B limit);
  a second loop after the specialized one (Triton 3.9's warp specialization pass fails to compile it),
  or a branch inside it (the loop is then not specialized at all).

The one-pass backward (KERNELS_FLASH_BACKWARD=one_pass: the dk/dv kernel adds dQ with pointer atomics),
same setup, forward+backward TFLOP/s at S = 4096: 362 against 386 for the default two-pass backward at
head_dim 128, 288 against 319 causal. So the atomics cost more than the two matmuls they save, and
two_pass stayed the default; TMA reduce-adds of whole dQ tiles are the next thing to try (the tenth round found
where those win: the default 'auto' backward runs one_pass there).

The backward, second round (same setup; forward+backward TFLOP/s, do_bench medians, each variant beside
cuDNN and the committed kernels in one process; tiles pinned; S = 4096 unless named):
- kept, behind KERNELS_FLASH_BACKWARD=one_pass on Hopper: _flash_bwd_tma_kernel, every tile moved by TMA
  and each dQ tile added by one TMA reduce-add (cp.reduce.async.bulk), 64x128/w8/s3 (64x64/w4/s3 at
  head_dim 64). Against two_pass with the tiles it had tuned: head_dim 128 382 vs 369, 421 vs 398 at
  S = 16384, causal 296 vs 312, 370 vs 335 at S = 16384 causal; head_dim 64 351 vs 336, causal 246 vs 273;
  cuDNN 511, 547, 446, 530, 421, 355 at those points. Every candidate tile met the fp64 reference on the
  H200 (lengths 1..1000 and unequal, head_dim 64/80/128, strided). The pointer kernel with only the dQ
  reduce-add by TMA gave 388 (S = 4096) and 424 (S = 16384).
- not kept: both kinds of program in one launch, FlexAttention's scheme (dK/dV programs first, dQ
  programs after, 64x128/w8/s2-3): 390 vs 385 at head_dim 128, 408 vs 405 at S = 16384, 312 vs 315
  causal, 296 vs 315 at head_dim 64: within noise or slower. Splitting every loop into unmasked tiles
  and masked ones (the forward's scheme) and running the longest causal programs first: 385 vs 375
  and 385 vs 396 (S = 16384) with the same tiles, within noise. Warp specialization of the TMA
  one-pass backward's loop: at 8 warps Triton did not specialize it (the same times as without), at 4
  warps Triton 3.9's warp-specialization pass fails to compile it (with the dQ reduce-add in the loop);
  128x128 tiles need 296 KB of shared memory. So the gap to cuDNN (0.72-0.77 at head_dim 128) is not
  the masks, the launches or the dQ additions.
- kept, in the default two-pass backward: the same TMA kernel without the dQ reduce-add, its query loop
  warp-specialized ('/ws' bwd_dkdv tiles; Triton builds a producer and two consumer warp groups at 4
  warps), beside the pointer dQ kernel: head_dim 128 414 vs 379 (S = 4096), 438 vs 394 (S = 16384)
  (cuDNN 576 and 557 in that process), 64x128/w4/s2 and /s3 alike; causal 330-335 vs 312, but its
  dK and dV came out wrong under the causal mask (errors up to 0.98, like the forward's mask inside a
  specialized loop), so causal calls never get it; head_dim 64 324 vs 344, so it is offered at head dims
  whose block is 128 only. A warp-specialized TMA dQ kernel did not compile (Triton 3.9: "unsupported
  load type for producer commit"; the fifteenth round found why, and made one that does).
- third round, not kept: the '/ws' kernels under a causal mask with the mask's indices made inside the
  specialized loop, or carried through it as a loop value (each row's last key, each key's first
  query): still wrong on triton 3.6 (errors 0.4-4 in the output and every gradient, at lengths 200 to
  1500, equal and unequal), so the fault is not in how the indices reach the consumer groups. They ran
  at 387 (S = 4096) and 435 (S = 16384) forward against 414 and 451 for the pointer kernel, and, both
  after that '/ws' forward, 332 and 375 forward+backward against 301 and 345 with the pointer dK/dV
  kernel (cuDNN 583, 565 and 471, 527). The masked tiles apart
  from the specialized loop, unrolled before or after it: with a branch per tile Triton 3.9 does not
  specialize the loop; without one its warp-specialization pass fails to compile the kernel.
  64x128/w4/s3/ws dK/dV tiles returned NaN in dK and dV without a causal mask too (lengths 1000 to
  2048), so only 64x128/w4/s2/ws is swept.
- fourth round, kept: the pointer dK/dV and dQ kernels apply the causal mask and the sequence bounds only
  to the tiles that cut them (a masked run, whole tiles unmasked, then the tail), as the forward does.
  The committed H200 run before it had causal forward+backward at head_dim 128 at 0.664-0.679 of cuDNN
  and 0.91x FlexAttention; the run after, 0.733-0.742 and 0.965-1.0x (344-397 TFLOP/s). With it, causal
  dK/dV tiles pinned at head_dim 128, S = 4096 (forward+backward): 32x64/w4/s2 340, 64x64/w4/s2 346,
  64x128/w8/s2 349, 64x128/w8/s3 334, 32x128/w4/s3 188, 64x128/w4/s2 184; dQ tiles 128x64/w8/s3 341,
  128x64/w8/s2 330, 64x64/w4/s2 333, 128x128/w8/s2 335: the tuner's choices are within noise of the best.
- fifth round, dropped: the causal forward on the '/ws' kernel, split in two launches. The pointer kernel ran
  the key tiles the mask cuts into an fp32 state of (acc, max, sum) rows; the TMA kernel's specialized
  loop ran the tiles before them unmasked, and merged that state after the loop (pointer loads), or
  (second try) started its loop from it (loaded before the loop). Right in the interpreter, both compile
  for sm_90; on the H200 (triton 3.6, bf16, head_dim 128) both came out wrong the same way (max error
  against fp64 0.14-3.8 at lengths 113-4096, equal and unequal; 0 at length 1, where the loop runs no
  tile), so the fault is not where the state is merged. Nor is it a loop bound that differs by program:
  a minimal '/ws' loop over keys [0, start_m), [start_m, seq), a trip count, or a bound loaded from memory
  (a minimal kernel, same GPU and tiles) was right in every form, at 494-505 TFLOP/s (568 over every key).
  Left to test on the GPU: the diagonal pointer kernel's state alone, and the '/ws' loop from an exact one. Speed,
  wrong as it was: 391 / 471 / 516 TFLOP/s at S = 4096 / 8192 / 16384 against 400 / 438 / 444 for the
  pointer kernel (cuDNN 527 / 540 / 558, FlexAttention 367 / 395 / 407). Code: commits 4965e71, a97e473.
- sixth round, kept: the split the other way round, so that the '/ws' kernel reads nothing but through
  descriptors: it runs first (PARTIAL), over the key tiles no row's mask cuts, and stores the output over
  them, normalised, and its log-sum-exp as the non-causal kernel stores its own (through descriptors);
  the pointer kernel (WS_N; DIAGONAL_FWD, then 128x64/w8/s2) then starts each row from that and runs the
  tiles at the diagonal. Right on the H200: the GPU tests' '/ws' grid, causal (head_dim 80 and 128,
  fp16 and bf16, strided; lengths 1, 113 and 203 both ways, where the '/ws' part is empty, 1024 and
  4096), and a bench against fp64 (bf16, head_dim 80 and 128) where the '/ws' part runs: max error the
  same as the pointer kernel's at 1000 x 1000 and 4096 x 4096, 0.00055 against 0.00034 at 130 queries x
  4000 keys (the partial output is rounded to bf16 before the merge). Forward TFLOP/s, same setup, one process: 388 / 452 / 495
  at S = 4096 / 8192 / 16384 against 413 / 419 / 432 for the pointer kernel at 128x64/w8/s3 and
  519 / 546 / 565 for cuDNN (0.748 / 0.828 / 0.876 of cuDNN against 0.796 / 0.767 / 0.764); the tuner
  took 64x64/w4/s3 at 4096 and the split at 8192 and 16384. Forward+backward: 336 / 366 / 399 against
  341 / 360 / 391 (cuDNN 472 / 507 / 538). The pipeline's performance job at that commit (185443d, not
  the committed run): causal forward 414 / 451 / 501, 0.788 / 0.824 / 0.854 of cuDNN, 1.14x / - / 1.25x
  FlexAttention (the committed run before it: 406 / 440 / 442, 0.788 / 0.816 / 0.803).
- sixth round, not kept: the same split for the dK/dV kernel (its '/ws' loop over the query tiles no
  mask cuts, PARTIAL; the pointer kernel then adds the tiles the mask cuts, FROM_PARTIAL). Handing
  fp32 dK and dV over through TMA stores needed 263768 B of shared memory on triton 3.6 (over the
  232448 B limit: OutOfResources at launch on the H200; triton 3.9 compiled it within the limit, so the
  sm_90 compile test, run with CI's triton, did not catch it); splitting those stores in column halves
  failed to compile on 3.6; handing them over in dK's and dV's own dtype fits (164312 B, as without the
  split) but doubled dK's error in the interpreter (max against fp64 0.00077 -> 0.00181 at 300 x 300,
  head_dim 64, fp16). Not run on the GPU. Code: 185443d (fp32 hand-over).
- seventh round, the cause (found without a GPU, in the TTGIR that triton 3.6 makes for sm_90): the
  warp-specialized loop splits the rows of the tile (the forward's queries, the dK/dV kernel's keys)
  between its two consumer groups, and for the second group it both replaces the tile's start by
  start + BLOCK/2 (right for the descriptors' coordinates) and slices tl.arange(0, BLOCK) to
  [BLOCK/2, BLOCK): start + tl.arange(0, BLOCK) comes out BLOCK/2 too far there, so every mask or
  pointer built on it (the causal mask, a plain store of the log-sum-exp, the split's pointer loads)
  missed by half a tile in one group, which is what rounds one to five measured. Counting rows from the
  tile's start, with the start added to the other side of the comparison as a scalar, the second group
  reads [BLOCK/2, BLOCK) against the unshifted start (the TTGIR of both kernels, causal, shows it).
  Behind WS_CAUSAL (off): the causal forward in one '/ws' launch and the causal '/ws' dK/dV kernel. To
  run on the H200: tests/test_flash_attention_gpu.py's WS_CAUSAL test, then bench_ws_causal.py.
- eighth round, right but not kept (WS_CAUSAL stays off): on the H200 (triton 3.6) the GPU test passes
  and bench_ws_causal.py's errors against fp64 are the same with WS_CAUSAL on as off (bf16, lengths 113
  to 4096, equal and unequal; max over out, dQ, dK, dV 0.0178 on, 0.0162 off at head_dim 128 and 80).
  So the half-tile shift was the whole fault. Speed (head_dim 128, each setting tuned afresh, one
  process), causal forward at S = 4096 / 8192 / 16384: 407 / 435 / 444 on against 411 / 452 / 490 off
  (cuDNN 513 / 538 / 546); forward+backward 318 / 354 / 370 on against 318 / 357 / 382 (cuDNN 442 /
  478 / 512). With it on the tuner never picked the one-launch '/ws' forward (128x64/w8/s3 won) nor the
  causal '/ws' dK/dV kernel (64x64/w4/s2 won): the split forward is faster, and the +10% of rounds one
  to five was work the wrong masks skipped.
- ninth round, kept: the '/ws' forward persistent (a grid of one program per SM, query tiles in a
  grid-stride loop). A minimal persistent kernel (descriptors made once over every head's rows) beside the
  committed kernel (a program per tile), bf16, non-causal, one process: head_dim 128 604 / 574 / 563
  TFLOP/s at S = 4096 / 8192 / 16384 against 529 / 553 / 557 (cuDNN 672 / 636 / 630); head_dim 64 448 /
  455 / 442 against 415 / 418 / 423 (cuDNN 479 / 486 / 466); two programs per SM were slower (557 at
  head_dim 128, S = 4096). In the project's kernel (descriptors made once when every head's rows are one
  matrix in whole tiles, FLAT, else per tile), tuned, another process: head_dim 128 608 / 582 / 566
  against 451 / 463 / 484 for the pointer kernel (cuDNN 679 / 614 / 686: cuDNN's own times moved by 10%
  between processes); head_dim 64 418 / 421 / 421 against 410 / 415 / 418 (cuDNN 477 / 481 / 481), so the
  '/ws' tiles are now offered at head_dim 64 too and the tuner picks. The tile loop's stages
  (tile_stages): pipelined, 424 / 433 / 424 and 430 / 431 / 424 at head_dim 64 against 412 / 406 / 411
  and 413 / 412 / 414 with one stage (two processes; cuDNN 474-493), kept there; at head_dim 128 within
  noise on 3.6 (600 / 553 / 567 against 606 / 544 / 547) and over the limit on 3.9 (295512 B), so one
  stage. The minimal kernel, in the same process: 450 / 445 / 452 at head_dim 64 (0.91-0.94 of cuDNN)
  against 430 / 431 / 424; what it lacks is the per-row guard against a running max of -inf (rows of
  -inf scores) and the tests of the rows' emptiness after the loop. Written, to measure
  (workflow/scripts/bench_persistent.py): a finite start for the running max (FWD_FINITE_START), which
  makes the guard unnecessary.
- ninth round, not kept: persistent under a causal mask (the split's '/ws' part, longest tiles first):
  414 / 471 / 398 against 412 / 434 / 450 for the pointer kernel at head_dim 128 (cuDNN 576 / 610 / 560),
  its tiles differing in length so that a grid-stride loop shares them out unevenly (the longest program
  1.57x the mean by tile count at S = 16384); causal calls keep a program per tile, now longest first
  across heads. Written, to measure (bench_persistent.py): rounds taken alternately forwards and
  backwards (CAUSAL_PERSISTENT; 1.007x by count), and the backward's TMA kernel persistent likewise
  (DKDV_PERSISTENT). Tensor descriptors made on the host (TensorDescriptor arguments) or over 3-D/4-D
  views (a tl.reshape after each load): Triton 3.6's warp specialization fails to compile either
  ("unsupported op type" in WSDataPartition), and 3.9's the second.
- tenth round (bench_persistent.py, one process, tuned afresh per setting; bf16, B*S = 16384, H = 16;
  TFLOP/s at S = 4096 / 16384, the default first; cuDNN in the same process 600-670 at head_dim 128 and
  moving up to 10% between settings). Kept: the running max from -FLT_MAX (no -inf guard) in the '/ws'
  forward: head_dim 64 445 / 463 against 421 / 432, 128 601 / 582 against 579 / 568, causal 128 408 /
  558 against 419 / 537 (errors against fp64 as before). Kept: the causal '/ws' forward persistent, rounds
  alternating direction: causal 128 420 / 549 against 419 / 537, causal 64 353 / 413 against 348 / 397;
  so the '/ws' forward is always persistent. Not kept: the backward's TMA kernel persistent (fwd+bwd at
  128 414 / 434 against 406 / 448, 64 336 / 366 against 344 / 359; with '/ws' dK/dV tiles at 64 too 337 /
  364); the one-pass backward persistent (287 / 307 at 64, 370 / 416 at 128, against the one-pass
  backward's 362 / 389 and 372 / 415); WS_CAUSAL with the rest (causal fwd 438 / 468, fwd+bwd 316 / 372
  at 128). The one-pass backward (not default: atomics, not bitwise reproducible) beat the two-pass
  one at head_dim 64 without a mask (fwd+bwd 362 / 389 against 344 / 359, cuDNN 424 / 446) and lost
  everywhere else (causal 64 260 / 321 against 295 / 339; 128 372 / 415 against 406 / 448).
  Removed: the causal two-pass backward on '/ws' dK/dV tiles split at the diagonal (WS_CAUSAL_BACKWARD,
  commit 773af9a), aimed at the gap this round left widest (causal fwd+bwd at head_dim 128: 0.73-0.74 of
  cuDNN). Triton (3.9) does not warp-specialize a kernel with a plain loop over the diagonal's query
  tiles before the specialized one (NVGPUWarpSpecialization fails), so the diagonal's tiles ran in the
  pointer kernel first, leaving fp32 sums that the '/ws' kernel went on from. Right in the interpreter;
  on the H200 its GPU test failed at head_dim 128 (bf16, fp16) and 80 (bf16; dK wrong at 113 x 203), and
  bench_persistent.py's error column had hidden NaN (since fixed), so its speed there (causal fwd+bwd at
  128 316 / 413 against 317 / 387) counts for nothing. The likely cause, read from Triton 3.6's sm_90 IR:
  each consumer partition staged its half of the fp32 sums (64x128, 32 KB) through a partition-local
  shared buffer for the TMA load, and the kernel grew by only 33544 B (164312 -> 197856 B at head_dim 80),
  so the two partitions, running at once, seem to share one buffer. A retry should load the sums without
  shared memory inside the partitions (pointer loads into registers, or add them after the loop).
- eleventh round (workflow/scripts/bench_persistent.py's settings and a scratch bench timing each backward
  kernel alone, do_bench medians; H200, triton 3.6, bf16, B*S = 16384, H = 16, tuned afresh, cuDNN in the
  same process). Where the backward's time goes, head_dim 128, S = 4096: dK/dV 2.075 ms (530 TFLOP/s of
  its 4 matmuls, '/ws'), dQ 1.400 (589 of 3), delta 0.044; causal: dK/dV 1.289-1.338 (411-427, pointer
  tiles), dQ 0.768-0.794 (520-537); causal at 16384: 4.631 (475), 2.798 (589). So the dK/dV kernel,
  causal most, is the weak part, and the dQ kernel is near the matmul ceiling (687-716).
  Kept: the diagonal split of the causal dK/dV (WS_CAUSAL_BACKWARD) with the '/ws' kernel starting from
  the diagonal's fp32 sums by pointer loads into registers (the sixth round's TMA load of them was the
  fault: the GPU test passes now, head_dim 128 bf16 and fp16, 80 bf16, lengths 1 to 4096, unequal both
  ways, strided). Causal, head_dim 128: dK/dV 4.104 ms against 4.631 at S = 16384 (536 against 475 TFLOP/s;
  forward+backward 9.122 against 9.627 ms), but 1.374 against 1.289 at 4096: the tuner picks between it
  and the pointer tiles. Adding the sums after the loop instead (also right): 4.283 and 1.458, slower.
  Kept: the causal pointer dK/dV and dQ programs longest first across heads (BWD_LONGEST_FIRST): head_dim 64,
  S = 4096, dK/dV 0.664 against 0.718 ms, forward+backward 1.500 against 1.561; head_dim 128 dQ 0.754 /
  2.737 against 0.768 / 2.798 (S = 4096 / 16384), dK/dV 1.317 / 4.750 against 1.289 / 4.631 (noise at
  4096; at 16384 the split now takes those programs).
  Not possible on triton 3.6 or 3.9: the one-pass backward's loop warp-specialized (dQ by TMA reduce-add or
  by pointer atomics): NVGPUWarpSpecialization fails at 64x128/w4 and 128x128/w4 (the dQ tile, a sum over
  the keys that the consumer groups split, is not partitioned: "Unexpected asyncTaskIds.size()"); only
  64x64/w4/s2 with pointer atomics compiles (12 warps). Not measured.
- twelfth round: the '/ws' kernels beside another process (H200, triton 3.6, bf16, B=4400, H=16, S=256, D=128,
  the allocator's pool first filled with NaN, every head scanned). Alone on the GPU every tile was right; with
  a second process looping 8192^2 bf16 matmuls on the same GPU, the '/ws' forward (128x128/w4/s2/ws) gave
  15-19 heads of NaN per call (of 70400) and the '/ws' dK/dV kernel 130-290 in dK, while the pointer tiles
  (128x64/w8/s3; every other dK/dV tile), the TMA one-pass backward and cuDNN's SDPA stayed finite in every
  head; the same matmuls on a side stream of the same process left every kernel right. So time-slicing between
  contexts, not the size or the memory, is what they cannot take (the committed run's finding 20 was this: its
  limits job ran beside four other GPU jobs), and it is Triton's warp specialization, not these kernels: a
  minimal warp-specialized matmul went wrong the same way, its plain twin not (ws_time_slicing.py). Kept then:
  they ran only where KERNELS_FLASH_WS=1 (later found and fixed: dead barriers in Triton's IR, sharing shared
  memory with the TMA tiles; kernels/_dead_barriers.py, and the default again). What that cost, the lab's own
  _throughput in one process (B*S = 16384, H = 16, medians; ratio to the fastest SDPA backend, cuDNN here,
  without / with the '/ws' kernels): forward D=128 0.771 / 0.910 (S = 4096) and 0.792 / 0.919 (16384), causal
  0.806 / 0.780 and 0.814 / 0.918; D=64 0.851 / 0.919 and 0.893 / 0.952, causal 0.855 / 0.812 and 0.864 / 0.926;
  forward+backward D=128 0.745 / 0.807 and 0.730 / 0.818, causal 0.680 / 0.680 and 0.728 / 0.794; D=64 0.797 /
  0.786 and 0.808 / 0.807, causal 0.812 / 0.802 and 0.790 / 0.811.
- thirteenth round, not possible (no GPU needed): FlashAttention-3's overlap of one key tile's softmax with
  the next tile's Q K^T, asked for in the pointer kernel's loop by issuing the next scores first. Triton
  3.6 and 3.9 both wait for that matmul at once (warp_group_dot_wait with pendings = 0 right after it in
  the sm_90 TTGIR, wait_group 0 in the PTX), as for every matmul of the usual loop: a wgmma stays in flight
  only as the loop-carried accumulator of its own dot. So the exponentials never run beside a matmul
  without warp specialization (wgmma_waits.py prints the waits of both loops).
- fourteenth round, the '/ws' kernels' fault found: Triton 3.6 initializes barriers in their shared memory
  that nothing uses and lets the TMA tiles fill the same bytes (ws_time_slicing.py). Compiled without them
  (kernels/_dead_barriers.py) and pinned (fwd 128x128/w4/s2/ws, dK/dV 64x128/w4/s2/ws, dQ 128x64/w8/s3 at
  D=128; D=64 dK/dV and dQ 64x64/w4/s2), bf16, B*S = 16384, H = 16, beside cuDNN in the same process (H200,
  TFLOP/s, ratio to cuDNN): forward D=128 604 (0.947) at S = 4096 and 574 (0.864) at 16384, D=64 415
  (0.898) at 4096; forward+backward D=128 439 (0.764) and 453 (0.806), D=64 346 (0.780). Kept: the default
  again, KERNELS_FLASH_WS=0 turns them off.
- fifteenth round (bench_dq_tma.py, its docstring has the figures): a warp-specialized TMA dQ kernel, its
  log-sum-exp and delta read through 1-D descriptors (pointer loads of them do not compile specialized). At
  head_dim 128 dQ alone 5-7% faster than the pointer kernel (645-668 TFLOP/s against 601-623), equal at a
  length that is not a multiple of the key tile, slower at head_dim 64; only where seq_q % 4 == 0 (its
  descriptors' starts must be 16-byte aligned: an illegal instruction at S = 1001). Kept (at 128x64/w4/s2/ws,
  first among the bwd_dq tiles at head_dim 128 without a mask): the committed run at f34206f, forward+backward
  D=128 0.813 / 0.809 / 0.828 of cuDNN at S = 4096 / 8192 / 16384, against 0.781 / 0.816 / 0.802 at c6bbb05.
- sixteenth round, where the causal time goes (profile_flash.py --causal, H200, bf16, D=128, B*S = 16384,
  H = 16, microseconds per call of each kernel). S = 8192, the tuner's split: forward 1062 ('/ws' part 919,
  the diagonal's pointer kernel 143, 13% of the time for 3% of the work) against cuDNN's 899; backward
  dK/dV 2334 ('/ws' part 2092, diagonal 242: the fp32 sums it hands over are 4x K's bytes, written and read
  again), dQ 1330, delta 36, against cuDNN's 2561 (one dK/dV/dQ kernel 2439, dot(dO, O) 65, dQ conversion
  55). S = 4096: the tuner ran no split (forward 658 on 128x64/w8/s3, dK/dV 1314 and dQ 793 on 64x64/w4/s2)
  against cuDNN's forward 473 and backward 1412. So the split's hand-over is the causal forward's gap at
  8192 (its pointer diagonal reads Q, the '/ws' part's output and K/V's diagonal tiles again: ~0.39 GB, a
  floor near 95 us at copy speed). Not possible (no GPU needed): the diagonal's key tiles in the '/ws'
  kernel itself, before or after its specialized loop (the online softmax takes key tiles in any order): as
  one or two masked steps written out (tl.static_range), with descriptor or pointer loads, or as a second
  loop, plain or specialized, NVGPUWarpSpecialization fails on triton 3.6 and 3.9 (the forward
  128x128/w4/s2/ws, D=128 and 64, sm_90): these kernels take no matmul outside the specialized loop.
- seventeenth round, the masked '/ws' kernels made lean (their causal key tiles keep the scale in one
  multiply-add and test no key; the dK/dV kernel with whole query tiles tests no row), then timed
  (bench_ws_causal.py, H200, triton 3.6, bf16, B*S = 16384, H = 16, causal, TFLOP/s forward / forward +
  backward, pinned 128x128/w4/s2/ws and 64x128/w4/s2/ws in both forms). Head_dim 128, S = 4096 / 8192 /
  16384: split 418 / 320, 478 / 374, 517 / 416; one launch, masked 450 / 341, 466 / 380, 483 / 416; cuDNN
  520 / 436, 575 / 488, 563 / 522. From those, the backward alone: masked 6% / 3% / 2% faster; the
  forward masked +7.6% at 4096, -2.5% at 8192, -6.5% at 16384. Head_dim 64 (no '/ws' dK/dV there): the split
  forward faster at every length (345 / 385 / 404 against 317 / 334 / 342). The GPU test of the masked
  kernels passed (three tile and dtype cases, eleven length pairs each). Kept: the masked forms as
  candidates beside the split ones ('/ws/masked'), so the tuner weighs the two per bucket, in place of
  the WS_CAUSAL and WS_CAUSAL_BACKWARD switches.
- eighteenth round, not possible (no GPU needed): a warp-specialized one-pass backward (FlashAttention-3's
  five matmuls per tile pair, where the two-pass backward runs seven: the causal backward's gap to cuDNN,
  0.69 at S = 8192 in the sixteenth round, is about 5 / 7). dQ added inside the specialized query loop
  by a descriptor's atomic_add (TMA reduce-add) or by plain pointer tl.atomic_add (relaxed, fp32): in a
  minimal kernel (descriptor loads, 64x128/w4/s2, D = 128, sm_90) NVGPUWarpSpecialization fails on
  triton 3.6 and on 3.9 for both; the same kernel without the add compiles specialized.
- nineteenth round, the causal split's diagonal tile (bench_ws_causal.py --diagonal, H200, triton 3.6, bf16,
  D = 128, B*S = 16384, H = 16, forward '/ws' 128x128/w4/s2, dK/dV 64x128/w4/s2/ws, dQ 128x64/w8/s3; every
  error checked first). Forward / forward + backward TFLOP/s at S = 8192 and 16384: 128x64/w8/s2 (the tile
  before) 474 / 373, 509 / 415; 64x64/w4/s2 506 / 373, 509 / 416; 64x64/w8/s2 454 / 374, 467 / 399;
  64x32/w4/s2 494 / 376, 497 / 418; cuDNN 545 / 492, 559 / 518. Kept: 64x64/w4/s2 (DIAGONAL_FWD), +7% at
  8192 (the split's hand-over was the gap there), a tie at 16384. Head_dim 64 (dK/dV 32x128/w4/s3, dQ
  64x64/w4/s2; errors against fp64 as at 128): 64x64/w4/s2 392 / 335 and 403 / 357 against 388 / 338 and
  403 / 355 for the tile before; cuDNN 438 / 403 and 442 / 426.
- twentieth round (bench_persistent.py, an H100 80GB HBM3: no H200 was lent; triton 3.6, bf16, B*S = 16384,
  H = 16, forward + backward TFLOP/s; cuDNN moved up to 15% between settings there, so only the kernel's own
  figures are compared). The one-pass backward against two_pass at head_dim 64 without a mask: S = 1024
  245.4 vs 253.2 (-3%), 4096 352.3 vs 330.7 (+6.5%), 16384 401.4 vs 364.3 (+10%), errors against fp64
  alike: kept as 'auto' from the 4096 bucket up (ONE_PASS_MIN_BUCKET; 2048 unmeasured). Causal, D = 128,
  S = 4096 / 16384: the persistent forward in LPT groups of heads 445.0 / 503.9 against 495.2 / 558.5 in
  one group, so the forward stays one group; forward + backward with the backward's kernels in groups 352.0
  / 428.6 against 333.0 / 414.8 in one group, kept (LPT_GROUP_BYTES). The causal '/ws' dQ kernel against
  the pointer dQ: 352.0 / 428.6 against 333.7 / 419.0 (+5.5% / +2.3%), D = 64 S = 4096 307.4 vs 306.7, kept.
- twenty-first round, nothing to gain (no GPU needed): warp specialization of the persistent forward's tile
  loop instead of its key loop (as upstream's Blackwell tutorial variant does, so that one tile's loads
  overlap the last tile's epilogue). In a minimal persistent forward (descriptors, bf16, D = 128,
  128x128/w4/s2, sm_90, causal or not), triton 3.6 makes the same TTGIR either way: the warp_specialize
  region already spans the tile loop, its producer partition walking the tiles and their key tiles ahead
  of the two consumer groups as far as the buffers allow, so this cannot be what closes the causal gap
  at S = 4096.
- twenty-second round (bench_persistent.py, an H100 80GB HBM3 again; triton 3.6, bf16, B*S = 16384, H = 16,
  causal, TFLOP/s and ratio to cuDNN in the same setting's run): LPT groups of 8 and 64 MiB against the
  default 32, forward + backward at D = 128, S = 4096 / 16384: 336.0 / 412.3 (0.785 / 0.805) and
  317.7 / 424.6 (0.749 / 0.798) against 348.8 / 413.7 (0.785 / 0.797); D = 64, S = 4096: 301.3, 294.9
  against 302.0. No size better at both lengths: 32 MiB kept. The causal persistent forward's tile loop
  with two stages (causal_stages2) against one: forward D = 128 428.0 / 458.3 against 484.8 / 535.9,
  D = 64 382.1 against 381.9: not kept (tile_stages stays 1 under a causal mask).
"""
from __future__ import annotations

import argparse
import os

import pandas as pd
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import kernels._flash_attention as fa  # first: it chooses the backend before triton is imported
from kernels import _flash_tiles
from kernels._triton import triton

WIDER = {
    "fwd": [(128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 8, 4), (128, 64, 4, 4), (128, 32, 4, 3),
            (64, 128, 4, 3), (64, 64, 4, 3), (64, 32, 4, 2), (32, 32, 4, 1)],
    "bwd_dkdv": [(64, 128, 4, 2, True), (64, 64, 4, 2), (64, 128, 8, 2), (64, 128, 8, 3),
                 (32, 128, 4, 3), (32, 128, 4, 5), (128, 64, 8, 2), (128, 128, 8, 2), (32, 64, 4, 2), (32, 32, 4, 1)],
    "bwd_dq": [(128, 64, 4, 2, True), (128, 64, 4, 3, True), (64, 64, 4, 2), (128, 64, 8, 2), (128, 64, 8, 3),
               (128, 32, 4, 3), (128, 32, 4, 5), (64, 128, 8, 2),
               (128, 128, 8, 2), (32, 64, 4, 2), (32, 32, 4, 1)],
}
POINTS = [(128, False), (128, True), (64, False)]
LENGTHS = [1024, 4096, 16384]


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


def main(path: str) -> None:
    os.environ.setdefault(fa.WS_ENV, "1")  # the '/ws' kernels studied here (the default; a caller's 0 stays)
    fa.CANDIDATES.update(WIDER)
    fa._candidates.cache_clear()
    rows = []
    for d, causal in POINTS:
        for n in LENGTHS:
            b, h = 16384 // n, 16
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
            do = torch.randn_like(q)
            chosen = fa.tune(q, k, v, causal=causal)
            for (kind, *_rest), per_tile in _flash_tiles.timings.items():
                if tuple(_rest[2:5]) == (causal, n, n) and _rest[1] == d:  # a TMA bucket's key ends in 'tma'
                    rows += [dict(d=d, causal=causal, seq=n, what=f"tune {kind}", tile=t, ms=ms) for t, ms in per_tile.items()]

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

            for provider, fwd in (("triton_flash", lambda: fa.flash_attention(q, k, v, causal=causal)), ("sdpa_cudnn", cudnn)):
                with torch.no_grad():
                    rows.append(dict(d=d, causal=causal, seq=n, what=f"fwd {provider}", tile=chosen["fwd"], ms=bench(fwd)))
                rows.append(dict(d=d, causal=causal, seq=n, what=f"fwd_bwd {provider}", tile=str(chosen),
                                 ms=bench(lambda: fwd().backward(do))))
            print(pd.DataFrame(rows).tail(4).to_string(), flush=True)
    q, k, v = (torch.randn(1, 1, 16, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with torch.no_grad():
        for provider, fn in (("triton_flash", lambda: fa.flash_attention(q, k, v)),
                             ("sdpa_flash", lambda: F.scaled_dot_product_attention(q, k, v))):
            rows.append(dict(d=64, causal=False, seq=16, what=f"launch_floor {provider}", tile="", ms=bench(fn)))
    df = pd.DataFrame(rows)
    df.to_csv(path, index=False)
    print(df[df["what"].str.startswith(("fwd", "launch"))].to_string())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="the CSV to write")
    main(parser.parse_args().out)
