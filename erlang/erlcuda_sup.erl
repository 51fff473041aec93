%% @private
-module(erlcuda_sup).
-behaviour(supervisor).

-export([start_link/0, init/1]).

-spec start_link() -> {ok, pid()} | ignore | {error, term()}.
start_link() ->
    supervisor:start_link({local, ?MODULE}, ?MODULE, []).

%% The port owner restarts the worker process itself, with back-off, so a worker that
%% cannot start never exhausts this supervisor. The intensity below only covers bugs in
%% the server: five crashes in ten seconds stop the application rather than spin.
-spec init([]) -> {ok, {supervisor:sup_flags(), [supervisor:child_spec()]}}.
init([]) ->
    Flags = #{strategy => one_for_one, intensity => 5, period => 10},
    %% First, so stopped last: the events the port owner sends as it stops are still run.
    Events = #{id => erlcuda_events,
               start => {erlcuda_events, start_link, []},
               restart => permanent,
               shutdown => 5000,
               type => worker,
               modules => [erlcuda_events]},
    %% Before the port owner: it tells the buffers of each new worker's epoch.
    Buffers = #{id => erlcuda_buffers,
                start => {erlcuda_buffers, start_link, []},
                restart => permanent,
                shutdown => 5000,
                type => worker,
                modules => [erlcuda_buffers]},
    Loader = #{id => erlcuda_loader,
               start => {erlcuda_loader, start_link, []},
               restart => permanent,
               shutdown => 5000,
               type => worker,
               modules => [erlcuda_loader]},
    %% Before the port owner, whose answers make room in the queues.
    Room = #{id => erlcuda_room,
             start => {erlcuda_room, start_link, []},
             restart => permanent,
             shutdown => 5000,
             type => worker,
             modules => [erlcuda_room]},
    Port = #{id => erlcuda_worker,
             start => {erlcuda_worker, start_link, []},
             restart => permanent,
             shutdown => 5000,
             type => worker,
             modules => [erlcuda_worker]},
    %% Last: the other nodes learn of this one once its worker is being started, and
    %% forget it before its jobs are failed at a stop.
    Cluster = #{id => erlcuda_cluster_sup,
                start => {erlcuda_cluster_sup, start_link, []},
                restart => permanent,
                shutdown => infinity,
                type => supervisor,
                modules => [erlcuda_cluster_sup]},
    {ok, {Flags, [Events, Buffers, Loader, Room, Port, Cluster]}}.
