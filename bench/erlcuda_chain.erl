%% The Erlang node of `bench/chain': device buffers and user kernels, timed from Erlang.
%%
%% `main(ConfigFile)' reads one map (`file:consult/1' syntax, written by bench/chain.py),
%% starts erlcuda with the backend it names and writes one JSON object a line on stdout:
%% `{"event":"result",...}' per measurement, `{"event":"info",...}' and `{"event":"done"}'
%% (or `{"event":"error",...}'). Each sample is one call's wall time in nanoseconds, from
%% before the first launch to its last reply (every call waits for its result, as
%% `launch_sync' does).
%%
%% Cases, on `size' f32 elements:
%%   chain_buffers   10 vector_adds, each on the previous result and B, every operand and
%%                   result a device buffer (`{keep, true}'), intermediates freed;
%%   chain_download  the same, and the last result downloaded as a binary;
%%   chain_port      the same 10 vector_adds with every operand and result through the port
%%                   (binaries, shared memory above its threshold, as any launch);
%%   saxpy_elementwise / saxpy_raw   z = a x + y over device buffers, the kernel written by
%%                   `erlcuda:elementwise/5' and the same loaded as CUDA C with `load/4'.
-module(erlcuda_chain).

-export([main/1]).

-define(TIMEOUT, 600000).
-define(CHAIN, 10).

-spec main(file:filename()) -> no_return().
main(ConfigFile) ->
    erlcuda_bench_io:main(ConfigFile, fun run/1).

run(#{backend := Backend, size := Size, reps := Reps, python := Python} = Config) ->
    logger:set_primary_config(level, error),
    ok = application:load(erlcuda),
    ok = application:set_env(erlcuda, backend, Backend),
    ok = application:set_env(erlcuda, python, Python),
    {ok, _} = application:ensure_all_started(erlcuda),
    ok = wait_up(200),
    Info = erlcuda:info(),
    erlcuda_bench_io:emit(#{event => info, backend => maps:get(backend, Info),
           devices => maps:get(devices, Info)}),
    A = floats(Size, 1),
    B = floats(Size, 2),
    {ok, HA} = erlcuda:upload(A, opts([])),
    {ok, HB} = erlcuda:upload(B, opts([])),
    Chain = fun() -> chain_buffers(HA, HB) end,
    %% Both chains give the exact sums before anything is timed.
    Last = Chain(),
    {ok, Got} = erlcuda:download(Last, opts([{format, binary}])),
    ok = erlcuda:free(Last),
    Got =:= chain_port(A, B) orelse error(chain_mismatch),
    check(Got, fun(I) -> value(I, 1) + ?CHAIN * value(I, 2) end) orelse error(chain_wrong),
    time_case(chain_buffers, Size, Reps, fun() -> ok = erlcuda:free(Chain()) end),
    time_case(chain_download, Size, Reps,
              fun() ->
                      H = Chain(),
                      {ok, _} = erlcuda:download(H, opts([{format, binary}])),
                      ok = erlcuda:free(H)
              end),
    time_case(chain_port, Size, Reps, fun() -> _ = chain_port(A, B) end),
    saxpy(HA, HB, Size, Reps, maps:get(user_kernels, Config, true)),
    ok = erlcuda:free(HA),
    ok = erlcuda:free(HB),
    erlcuda_bench_io:emit(#{event => memory, devices => device_memory()}).

chain_buffers(HA, HB) ->
    lists:foldl(fun(I, X) ->
                        {ok, Y} = erlcuda:launch_sync(vector_add, [X, HB], opts([{keep, true}])),
                        I > 1 andalso erlcuda:free(X),
                        Y
                end, HA, lists:seq(1, ?CHAIN)).

chain_port(A, B) ->
    lists:foldl(fun(_, X) ->
                        {ok, Y} = erlcuda:launch_sync(vector_add, [X, B],
                                                      opts([{format, binary}])),
                        Y
                end, A, lists:seq(1, ?CHAIN)).

saxpy(_, _, _, _, false) ->
    ok;
saxpy(HX, HY, Size, Reps, true) ->
    ok = erlcuda:elementwise(saxpy_elementwise, [{a, {scalar, f32}}, {x, f32}, {y, f32}],
                             [{z, f32}], <<"z = a * x + y">>, [{timeout, ?TIMEOUT}]),
    ok = erlcuda:load(saxpy_module, saxpy_source(),
                      [{saxpy_raw, [{scalar, f32}, {in, f32}, {in, f32}, {out, f32},
                                    {scalar, i64}]}], [{timeout, ?TIMEOUT}]),
    {ok, Z} = erlcuda:zeros(f32, Size, opts([])),
    Ew = fun() ->
                 {ok, H} = erlcuda:launch_sync(saxpy_elementwise, [2.0, HX, HY],
                                               opts([{keep, true}])),
                 H
         end,
    Raw = fun() ->
                  {ok, []} = erlcuda:launch_sync(saxpy_raw, [2.0, HX, HY, Z, Size],
                                                 opts([{elements, Size}])),
                  ok
          end,
    H1 = Ew(),
    {ok, E1} = erlcuda:download(H1, opts([{format, binary}])),
    ok = erlcuda:free(H1),
    ok = Raw(),
    {ok, R1} = erlcuda:download(Z, opts([{format, binary}])),
    E1 =:= R1 orelse error(saxpy_mismatch),
    check(E1, fun(I) -> 2.0 * value(I, 1) + value(I, 2) end) orelse error(saxpy_wrong),
    time_case(saxpy_elementwise, Size, Reps, fun() -> ok = erlcuda:free(Ew()) end),
    time_case(saxpy_raw, Size, Reps, Raw),
    ok = erlcuda:free(Z).

saxpy_source() ->
    <<"extern \"C\" __global__ void saxpy_raw(float a, const float *x, const float *y,\n"
      "                                        float *z, long long n) {\n"
      "  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;\n"
      "       i += (long long)blockDim.x * gridDim.x)\n"
      "    z[i] = a * x[i] + y[i];\n"
      "}\n">>.

time_case(Name, Size, Reps, Fun) ->
    Fun(),  % warm-up
    Samples = [begin
                   T0 = erlang:monotonic_time(nanosecond),
                   Fun(),
                   erlang:monotonic_time(nanosecond) - T0
               end || _ <- lists:seq(1, Reps)],
    erlcuda_bench_io:emit(#{event => result, 'case' => Name, size => Size, samples_ns => Samples}).

opts(Extra) ->
    Extra ++ [{timeout, ?TIMEOUT}].

%% Small integers in f32: every sum in the chain is exact, so results compare bitwise.
floats(Size, Seed) ->
    << <<(value(I, Seed)):32/float-little>> || I <- lists:seq(0, Size - 1) >>.

value(I, Seed) ->
    float((I * Seed) rem 97).

%% Element I of a result against `Expect(I)', at a thousand places and both ends.
check(Bin, Expect) ->
    N = byte_size(Bin) div 4,
    Places = lists:usort([0, N - 1 | [(K * 7919) rem N || K <- lists:seq(1, 1000)]]),
    lists:all(fun(I) ->
                      <<X:32/float-little>> = binary:part(Bin, I * 4, 4),
                      X == Expect(I)
              end, Places).

device_memory() ->
    #{device_info := Devices} = erlcuda:info(),
    [maps:with([buffers, buffer_bytes, buffer_peak], D) || D <- Devices].

wait_up(0) ->
    {error, not_up};
wait_up(N) ->
    case erlcuda:info() of
        #{worker_status := up} -> ok;
        _ -> timer:sleep(50), wait_up(N - 1)
    end.

